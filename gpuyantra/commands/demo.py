"""`gpuyantra demo`: `up`, a served small model, and one campaign against it, on this machine."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpuyantra.commands import stage_printer
from gpuyantra.commands.up import add_stack_arguments, save_admin_token, start_stack, stop_all
from gpuyantra.processes import StartupError, exit_on_sigterm, free_port, start_server

if TYPE_CHECKING:
    from gpuyantra.campaign.records import CampaignInput


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="up + a served small model + one campaign against it",
        description="Start Temporal, the workers and a served small model (random weights), run one "
        "campaign and print a short summary (the result JSON is saved beside the report; --json prints it).",
    )
    add_stack_arguments(parser)
    parser.add_argument("--model", default="tiny-qwen2", help="preset or local model folder (default tiny-qwen2)")
    parser.add_argument("--ops", default="rms_norm", help="op families to optimize (default rms_norm)")
    parser.add_argument("--port", type=int, default=None, help="serving port (default: a free port)")
    parser.add_argument("--keep", action="store_true", help="keep everything running after the campaign")
    parser.add_argument(
        "--json", action="store_true", help="print the campaign result as JSON on stdout instead of the summary"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gpuyantra import config
    from gpuyantra.campaign.records import CampaignInput
    from gpuyantra.campaign_client import new_workflow_id
    from gpuyantra.report import write_report
    from gpuyantra.rewards import ceiling
    from gpuyantra.triton_env import cuda_available

    os.environ.setdefault("GPUYANTRA_ADMIN_TOKEN", secrets.token_urlsafe(16))
    device = "cuda" if cuda_available() else "cpu"
    say = stage_printer("demo", quiet=args.json)
    exit_on_sigterm()
    say("starting Temporal and the workers ...")
    try:
        processes = start_stack(args)
    except StartupError as exc:
        print(f"gpuyantra demo: {exc}", file=sys.stderr)
        return 1
    temporal = processes[0]
    state = temporal.log_path.parent.parent
    save_admin_token(state)
    try:
        say(f"loading {args.model} on {device} ...")
        server = start_server(
            args.model, state, args.port or free_port(), os.environ["GPUYANTRA_ADMIN_TOKEN"], device=device
        )
        processes.append(server)
        # Speed is judged only on a GPU; on CPU a correct kernel (+1) is the best there is.
        params = CampaignInput(server_url=server.info["url"], ops=args.ops.split(","), min_reward=ceiling(device))
        say(f"campaign for {', '.join(params.ops or [])} against {server.info['url']} (min_reward {params.min_reward})")
        started = time.monotonic()
        workflow_id = new_workflow_id(params.server_url, args.model, params.ops)
        result = asyncio.run(campaign(temporal.info["address"], params, workflow_id, say))
        reports = config.reports_dir()
        saved = reports / f"{workflow_id}.json"
        saved.write_text(json.dumps(result, indent=2))
        report = write_report(result, reports / f"{workflow_id}.html")
        if args.json:
            print(json.dumps(result))
        else:
            where = Where(state, temporal.info["address"], temporal.info["ui"], server.info["url"], args.keep)
            print("\n".join(demo_summary(result, time.monotonic() - started, report, saved, where)), flush=True)
        if args.keep:
            while all(p.process.poll() is None for p in processes):
                time.sleep(1)
        return 0 if result["deployed"] else 1
    except StartupError as exc:
        print(f"gpuyantra demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_all(processes)


async def campaign(address: str, params: CampaignInput, workflow_id: str, say: Callable[[str], None]) -> dict[str, Any]:
    """The campaign's result; its progress, one line per change, through `say`."""
    from gpuyantra.campaign_client import connect, follow, launch

    handle = await launch(await connect(address), params, workflow_id)
    return await follow(handle, say)


@dataclass(frozen=True)
class Where:
    """Where the demo's pieces were, to say which links still answer."""

    state: Path
    temporal_address: str
    web_ui: str
    server_url: str
    kept: bool


def demo_summary(result: dict[str, Any], seconds: float, report: Path, saved: Path, where: Where) -> list[str]:
    """At most 30 lines: the campaign's summary, the report, and links that answer now, or how to
    bring them back once the demo has stopped its processes."""
    from gpuyantra.report.result import text_summary

    workflow_id = str(result.get("workflow_id"))
    page = f"{where.web_ui}/namespaces/default/workflows/{quote(workflow_id, safe='')}"
    lines = [*text_summary(result)[:MAX_SUMMARY_TARGET_LINES], f"  took {seconds:.0f} s", ""]
    lines += [f"Report:  {report}", f"Result:  {saved}  (`gpuyantra report --from-json` redraws the page)"]
    if where.kept:
        return lines + [
            "Running until Ctrl-C:",
            f"  Web UI:   {page}",
            f"  kernels:  gpuyantra kernels list --server {where.server_url} --state-dir {where.state}",
            f"  status:   gpuyantra status --server {where.server_url} --state-dir {where.state}",
        ]
    ports = (
        "" if where.temporal_address.endswith(":7233") else f" --temporal-port {where.temporal_address.split(':')[-1]}"
    )
    return lines + [
        f"The demo has stopped its server, workers and Temporal; the campaign's history stays in {where.state}.",
        f"  Web UI again:  gpuyantra up --state-dir {where.state}{ports}, then {page}",
        "  all kept up:   gpuyantra demo --keep",
        f"  logs:          {where.state / 'logs'}",
    ]


# The summary's lines about targets and speeds, at most: a demo has one or two targets and two batches.
MAX_SUMMARY_TARGET_LINES = 18
