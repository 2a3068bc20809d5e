"""`gpuyantra worker gpu|cpu|all`: run Temporal workers until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time

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
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--device",
        default=None,
        metavar="cuda:N",
        help="the GPU this worker verifies on (it sees that one alone); default: the first visible",
    )
    where.add_argument(
        "--devices",
        choices=["all"],
        default=None,
        help="`all`: one GPU worker per visible GPU, each its own process (`--device cuda:N`)",
    )
    parser.add_argument(
        "--hardware-kind",
        type=hardware_kind_arg,
        default=None,
        metavar="KIND",
        help="the hardware kind this GPU worker announces and verifies for (default: from the device's "
        "name, e.g. nvidia-h100-80gb; `cpu` without a GPU); campaigns verify on workers of their "
        "server's kind",
    )
    parser.set_defaults(handler=run)


def hardware_kind_arg(text: str) -> str:
    from gpuyantra.hardware import check_kind

    try:
        return check_kind(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def device_index(device: str) -> int:
    """`cuda:1` -> 1 (ValueError on anything else)."""
    prefix, _, index = device.partition(":")
    if prefix != "cuda" or not index.isdigit():
        raise ValueError(f"--device {device!r}: expected cuda:N (N = the GPU's index on this machine)")
    return int(index)


def see_one_gpu(device: str) -> None:
    """This process (and the sandbox children it starts) sees only `device`, as `cuda`: the verifier,
    its GPU locks and its spares then need no index. Maps through an existing CUDA_VISIBLE_DEVICES."""
    index = device_index(device)
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if visible and index >= len(visible):
        raise ValueError(f"--device {device}: CUDA_VISIBLE_DEVICES={','.join(visible)} shows {len(visible)} GPU(s)")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[index] if visible else str(index)


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

    device = getattr(args, "device", None)
    try:
        if (device is not None or getattr(args, "devices", None)) and args.role == "cpu":
            raise ValueError("--device and --devices are for GPU workers (role gpu or all)")
        if device is not None:
            see_one_gpu(device)
        config.switch_interval_s()  # a bad setting stops the worker before it connects, in one line
        trust_servers(args.server)
        connect_options()  # Temporal's TLS files and API key are readable (gpuyantra/temporal_auth.py)
    except ValueError as exc:
        print(f"gpuyantra worker: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    address = args.temporal or config.temporal_address()
    if getattr(args, "devices", None) == "all":
        from gpuyantra.hardware import visible_cuda_devices

        gpus = visible_cuda_devices()
        if gpus:
            return run_per_device(args, address, gpus)
        print("gpuyantra worker: --devices all: no GPU visible; one worker on the CPU", file=sys.stderr)
    try:
        asyncio.run(
            run_workers(
                args.role,
                address,
                gpu_slots=args.gpu_slots,
                hardware_kind=getattr(args, "hardware_kind", None),
                machine_device=device,
            )
        )
    except TemporalUnreachable as exc:
        if getattr(args, "debug", False):
            raise
        print(f"gpuyantra worker: {exc}", file=sys.stderr)
        return 1
    return 0


def per_device_argv(args: argparse.Namespace, address: str, device: str) -> list[str]:
    """The `gpuyantra worker` command line of one device's worker, with this command's options."""
    argv = [sys.executable, "-m", "gpuyantra.cli", "worker", args.role, "--temporal", address, "--device", device]
    if args.gpu_slots is not None:
        argv += ["--gpu-slots", str(args.gpu_slots)]
    if getattr(args, "hardware_kind", None):
        argv += ["--hardware-kind", args.hardware_kind]
    for spec in args.server:
        argv += ["--server", spec]
    return argv


def run_per_device(args: argparse.Namespace, address: str, devices: list[str]) -> int:
    """`--devices all`: one worker process per GPU in `devices`, until Ctrl-C or one of them exits
    (then the others are stopped and its exit status returned). Only the first device's process runs
    the CPU queues of role `all`: the others run `gpu`."""
    import subprocess

    from gpuyantra.processes import exit_on_sigterm

    exit_on_sigterm()
    children = []
    for position, device in enumerate(devices):
        role_args = argparse.Namespace(**{**vars(args), "role": args.role if position == 0 else "gpu"})
        children.append(subprocess.Popen(per_device_argv(role_args, address, device)))
    try:
        while all(child.poll() is None for child in children):
            time.sleep(1.0)
        return next(child.returncode for child in children if child.returncode is not None)
    except KeyboardInterrupt:
        return 0
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            child.wait()
