"""`gpuyantra worker gpu|cpu|all`: run Temporal workers until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
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
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gpuyantra.campaign_client import TemporalUnreachable
    from workers.main import run_workers

    try:
        config.switch_interval_s()  # a bad setting stops the worker before it connects, in one line
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
