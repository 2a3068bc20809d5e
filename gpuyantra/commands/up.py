"""`gpuyantra up`: a Temporal dev server persisted in the state folder plus `worker all`."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import time
from pathlib import Path

from gpuyantra import config
from gpuyantra.processes import Managed, StartupError, exit_on_sigterm, start_temporal, start_worker


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir", default=None, help="state folder (default: $GPUYANTRA_STATE_DIR, else ~/.local/share/gpuyantra)"
    )
    parser.add_argument("--temporal-port", type=int, default=7233, help="Temporal gRPC port (default 7233)")
    parser.add_argument("--ui-port", type=int, default=None, help="Web UI port (default gRPC port + 1000)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start a Temporal dev server and all workers on this machine",
        description="Start `temporal server start-dev` (SQLite in the state folder) "
        "and `gpuyantra worker all`; stop both on Ctrl-C.",
    )
    add_stack_arguments(parser)
    parser.add_argument(
        "--admin-token",
        default=None,
        help="bearer token the workers send to the server's /admin routes (default: "
        "$GPUYANTRA_ADMIN_TOKEN, else a new one, printed and kept in <state>/admin-token)",
    )
    parser.set_defaults(handler=run)


def state_folder(args: argparse.Namespace) -> Path:
    if args.state_dir:
        os.environ["GPUYANTRA_STATE_DIR"] = args.state_dir
    return config.state_dir()


def gpus_on_this_machine() -> list[str]:
    """`cuda:0`, `cuda:1`, ...: torch is asked only where an NVIDIA driver is installed (its import
    costs seconds a CPU-only `up` need not pay)."""
    if shutil.which("nvidia-smi") is None:
        return []
    from gpuyantra.hardware import visible_cuda_devices

    return visible_cuda_devices()


def worker_commands(gpus: list[str]) -> list[tuple[str, list[str], str]]:
    """(role, extra arguments, log name) of each worker `up` starts: `worker all` on a machine with
    at most one GPU; with several, `all` on the first and one `gpu` worker per other GPU, each on
    its own device (they verify side by side, and campaigns route verifications to them)."""
    if len(gpus) <= 1:
        return [("all", [], "worker-all")]
    first, *others = gpus
    return [
        ("all", ["--device", first], "worker-all"),
        *(("gpu", ["--device", gpu], f"worker-gpu-{gpu.replace(':', '')}") for gpu in others),
    ]


def start_stack(args: argparse.Namespace) -> list[Managed]:
    state = state_folder(args)
    temporal = start_temporal(state, port=args.temporal_port, ui_port=args.ui_port)
    started: list[Managed] = [temporal]
    try:
        for role, extra, name in worker_commands(gpus_on_this_machine()):
            started.append(start_worker(role, temporal.info["address"], state, extra_args=extra, name=name))
    except StartupError:
        stop_all(started)
        raise
    return started


def stop_all(processes: list[Managed]) -> None:
    for managed in reversed(processes):
        managed.stop()


def admin_token_for(args: argparse.Namespace, state: Path) -> bool:
    """Set the admin token the workers inherit: the flag, else the environment, else the one kept in
    `<state>/admin-token` by an earlier `up`, else a new one. True when it came from the state folder."""
    kept = state / "admin-token"
    token = getattr(args, "admin_token", None) or os.environ.get("GPUYANTRA_ADMIN_TOKEN")
    if token:
        os.environ["GPUYANTRA_ADMIN_TOKEN"] = token
        return False
    os.environ["GPUYANTRA_ADMIN_TOKEN"] = (
        kept.read_text().strip() if kept.is_file() and kept.read_text().strip() else secrets.token_urlsafe(24)
    )
    return True


def save_admin_token(state: Path) -> Path:
    """Keep the demo's admin token in the state folder (owner-only) so the printed curl works."""
    path = state / "admin-token"
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(os.environ["GPUYANTRA_ADMIN_TOKEN"])
    return path


def run(args: argparse.Namespace) -> int:
    exit_on_sigterm()
    generated = admin_token_for(args, state_folder(args))
    try:
        processes = start_stack(args)
    except StartupError as exc:
        print(f"gpuyantra up: {exc}")
        return 1
    temporal = processes[0]
    print(
        f"Temporal at {temporal.info['address']}; Web UI {temporal.info['ui']}; logs in "
        f"{temporal.log_path.parent}. Ctrl-C stops everything.",
        flush=True,
    )
    if generated:
        token_file = save_admin_token(config.state_dir())
        print(
            f"Admin token (the workers use it): kept in {token_file}. Start the server with the same "
            f"token: gpuyantra serve ... --admin-token-file {token_file}",
            flush=True,
        )
    else:
        print(
            "Admin token: the workers use the one given (--admin-token or $GPUYANTRA_ADMIN_TOKEN); "
            "start the server with the same.",
            flush=True,
        )
    try:
        while all(p.process.poll() is None for p in processes):
            time.sleep(1)
        dead = [p for p in processes if p.process.poll() is not None]
        print(f"gpuyantra up: {dead[0].name} exited:\n{dead[0].log_tail()}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_all(processes)
