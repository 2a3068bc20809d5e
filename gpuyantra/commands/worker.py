"""`gpuyantra worker gpu|cpu|all`: run Temporal workers until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from gpuyantra import config
from gpuyantra.commands import positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run Temporal workers (gpu, cpu or all queues)",
        description="Run Temporal workers: `gpu` polls the GPU task queue (profile, "
        "verify, benchmark, deploy), `cpu` the CPU queue (author, skill "
        "library) and the campaign workflow, `all` both.",
    )
    parser.add_argument("role", choices=["gpu", "cpu", "all"])
    parser.add_argument(
        "--temporal",
        default=None,
        metavar="HOST:PORT",
        help="Temporal frontend address (default: $TEMPORAL_ADDRESS or localhost:7233)",
    )
    parser.add_argument(
        "--gpu-slots",
        type=positive_int,
        default=None,
        metavar="N",
        help="GPU-queue activities at once (default: 8 on CUDA, 1 on CPU); verifications' timing "
        "phases still run one at a time",
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="a serving process this worker may send admin requests (and its token) to, beside `local` "
        "(http://127.0.0.1:8000); repeatable; its token: $GPUYANTRA_ADMIN_TOKEN_<NAME>, else the admin "
        "token. Campaigns naming any other server fail at preflight",
    )
    parser.set_defaults(handler=run)


def trust_servers(specs: list[str]) -> None:
    """Add `--server NAME=URL` to $GPUYANTRA_SERVERS, which the activities read (ValueError on a bad one)."""
    from gpuyantra.trusted_servers import SERVERS_ENV, parse_server_spec, trusted_servers

    for spec in specs:
        parse_server_spec(spec)
    kept = [spec for spec in os.environ.get(SERVERS_ENV, "").split(",") if spec.strip()]
    if specs:
        os.environ[SERVERS_ENV] = ",".join([*kept, *specs])
    trusted_servers()  # a bad $GPUYANTRA_SERVERS stops the worker here, not its first campaign


def run(args: argparse.Namespace) -> int:
    from gpuyantra.campaign_client import TemporalUnreachable
    from gpuyantra.temporal_auth import connect_options
    from workers.main import run_workers

    try:
        config.switch_interval_s()  # a bad setting stops the worker before it connects, in one line
        trust_servers(args.server)
        connect_options()  # Temporal's TLS files and API key are readable (gpuyantra/temporal_auth.py)
    except ValueError as exc:
        print(f"gpuyantra worker: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    address = args.temporal or config.temporal_address()
    try:
        asyncio.run(run_workers(args.role, address, gpu_slots=args.gpu_slots))
    except TemporalUnreachable as exc:
        if getattr(args, "debug", False):
            raise
        print(f"gpuyantra worker: {exc}", file=sys.stderr)
        return 1
    return 0
