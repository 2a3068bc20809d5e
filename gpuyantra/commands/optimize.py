"""`gpuyantra optimize --server URL`: start a campaign against a running server."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from gpuyantra import config
from gpuyantra.server_client import ServerError, check_reachable


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("optimize", help="start an optimization campaign against a running server",
                                   description="Start the OptimizeCampaign workflow on Temporal against a "
                                               "running `gpuyantra serve` process.")
    parser.add_argument("--server", required=True, help="the serving process, e.g. http://127.0.0.1:8000")
    parser.add_argument("--ops", type=comma_list, default=None, help="op families to optimize, comma separated")
    parser.add_argument("--min-reward", type=int, choices=[1, 2, 3], default=3,
                        help="least verifier reward a kernel needs to be deployed (CPU-only setups: 1)")
    parser.add_argument("--max-iterations", type=iterations, default=6)
    parser.add_argument("--require-approval", action="store_true",
                        help="wait for the `approve` signal before each deployment")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="where candidates are verified (default: the GPU worker's device)")
    parser.add_argument("--temporal", default=None, metavar="HOST:PORT")
    parser.add_argument("--wait", action="store_true", help="follow the campaign to its end")
    parser.add_argument("--json", action="store_true", help="print the campaign result as JSON, last on stdout")
    parser.set_defaults(handler=run)


def comma_list(text: str) -> list[str]:
    from gpuyantra.campaign_client import unknown_ops

    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = unknown_ops(names)
    if unknown:
        raise argparse.ArgumentTypeError(unknown)
    return names


def iterations(text: str) -> int:
    from workflows.inputs import RANGES  # the workflow's own bounds: refuse here what it would refuse

    value, (low, high) = int(text), RANGES["max_iterations"]
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
    return value


def run(args: argparse.Namespace) -> int:
    from gpuyantra.campaign_client import CampaignRefused, TemporalUnreachable, start_campaign
    from workflows.types import CampaignInput

    try:
        check_reachable(args.server)
    except ServerError as exc:
        print(f"gpuyantra optimize: {exc}; start it with `gpuyantra serve` or fix --server", file=sys.stderr)
        return 1
    params = CampaignInput(server_url=args.server, ops=args.ops, min_reward=args.min_reward,
                           max_iterations=args.max_iterations, require_approval=args.require_approval,
                           device=args.device)
    address = args.temporal or config.temporal_address()
    try:
        result = asyncio.run(start_campaign(address, params, wait=args.wait))
    except (TemporalUnreachable, CampaignRefused) as exc:
        if getattr(args, "debug", False):
            raise
        print(f"gpuyantra optimize: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a failed workflow: show its cause, not a traceback
        print(f"gpuyantra optimize: campaign failed: {describe_failure(exc)}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def describe_failure(exc: BaseException) -> str:
    messages = []
    while exc is not None:
        messages.append(str(exc))
        exc = exc.__cause__
    return " <- ".join(m for m in messages if m)
