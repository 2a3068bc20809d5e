"""`gpuyantra demo`: `up`, a served small model, and one campaign against it, on this machine."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time

from gpuyantra.commands.up import add_stack_arguments, save_admin_token, start_stack, stop_all
from gpuyantra.processes import StartupError, exit_on_sigterm, free_port, start_server


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="up + a served small model + one campaign against it",
        description="Start Temporal, the workers and a served small model (random "
        "weights), run one campaign and print its result.",
    )
    add_stack_arguments(parser)
    parser.add_argument("--model", default="tiny-qwen2", help="preset or local model folder (default tiny-qwen2)")
    parser.add_argument("--ops", default="rms_norm", help="op families to optimize (default rms_norm)")
    parser.add_argument("--port", type=int, default=None, help="serving port (default: a free port)")
    parser.add_argument("--keep", action="store_true", help="keep everything running after the campaign")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gpuyantra import config
    from gpuyantra.campaign_client import new_workflow_id, start_campaign
    from gpuyantra.report import write_report
    from gpuyantra.rewards import ceiling
    from gpuyantra.triton_env import cuda_available
    from workflows.types import CampaignInput

    os.environ.setdefault("GPUYANTRA_ADMIN_TOKEN", secrets.token_urlsafe(16))
    device = "cuda" if cuda_available() else "cpu"
    exit_on_sigterm()
    try:
        processes = start_stack(args)
    except StartupError as exc:
        print(f"gpuyantra demo: {exc}")
        return 1
    temporal = processes[0]
    token_file = save_admin_token(temporal.log_path.parent.parent)
    try:
        server = start_server(
            args.model,
            temporal.log_path.parent.parent,
            args.port or free_port(),
            os.environ["GPUYANTRA_ADMIN_TOKEN"],
            device=device,
        )
        processes.append(server)
        # Speed is judged only on a GPU; on CPU a correct kernel (+1) is the best there is.
        params = CampaignInput(server_url=server.info["url"], ops=args.ops.split(","), min_reward=ceiling(device))
        print(
            f"gpuyantra demo: serving {args.model} at {server.info['url']} on {device}; "
            f"campaign for {params.ops} (min_reward {params.min_reward}) ...",
            flush=True,
        )
        started = time.monotonic()
        workflow_id = new_workflow_id(params.server_url, args.model, params.ops)
        result = asyncio.run(start_campaign(temporal.info["address"], params, wait=True, workflow_id=workflow_id))
        print(json.dumps(result, indent=2))
        print(
            f"\nCampaign {result['workflow_id']} finished in {time.monotonic() - started:.0f}s.\n"
            f"  Web UI:        {temporal.info['ui']}/namespaces/default/workflows/{result['workflow_id']}\n"
            f"  Temporal CLI:  temporal workflow show --address {temporal.info['address']} "
            f"-w {result['workflow_id']}\n"
            f'  Kernels:       curl -H "Authorization: Bearer $(cat {token_file})" '
            f"{server.info['url']}/admin/kernels\n"
            f"  Find it:       temporal workflow list --address {temporal.info['address']} "
            f"--query 'GpuyantraModel=\"{result.get('model') or args.model}\"'\n"
            f"  Report:        {write_report(result, config.reports_dir() / f'{workflow_id}.html')}\n"
            f"  Logs:          {temporal.log_path.parent}",
            flush=True,
        )
        if device == "cpu":
            print(
                "  Note: without a GPU the kernel runs in Triton's interpreter, so served tokens/s drops "
                "after the swap; that is why CPU verdicts judge correctness only (reward +1).",
                flush=True,
            )
        if not args.keep:
            print(
                "  The demo stops its processes now. The campaign's history stays in "
                f"{temporal.log_path.parent.parent / 'temporal.db'}: `gpuyantra up` shows it again in the Web UI; "
                "`gpuyantra demo --keep` keeps everything running.",
                flush=True,
            )
        if args.keep:
            print("Running until Ctrl-C.", flush=True)
            while all(p.process.poll() is None for p in processes):
                time.sleep(1)
        return 0 if result["deployed"] else 1
    except StartupError as exc:
        print(f"gpuyantra demo: {exc}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_all(processes)
