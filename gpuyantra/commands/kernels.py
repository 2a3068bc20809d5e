"""`gpuyantra kernels list|rollback`: the kernels swapped into a running server, without curl."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from gpuyantra import config
from gpuyantra.commands.dashboard import add_server_argument, add_token_argument
from gpuyantra.server_client import (
    LIST_TIMEOUT_S,
    ROLLBACK_TIMEOUT_S,
    AdminClient,
    ServerError,
    active_kernels,
    rollback,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kernels",
        help="list the kernels swapped into a running server, or roll one back",
        description="The serving process's admin API (GET /admin/kernels, POST /admin/rollback) with the admin token.",
    )
    where = argparse.ArgumentParser(add_help=False)
    add_server_argument(where)
    add_token_argument(where)
    sub = parser.add_subparsers(dest="kernels_command", metavar="ACTION", required=True)

    p = sub.add_parser("list", parents=[where], help="one line per kernel swapped in now")
    p.add_argument("--json", action="store_true", help="print the active swap records as a JSON array")
    p.set_defaults(handler=_list)

    p = sub.add_parser("rollback", parents=[where], help="restore the original forward of an op's swapped kernels")
    p.add_argument("target", metavar="OP", help="op family (every active swap of it) or one swap id")
    p.set_defaults(handler=_rollback)


NO_TOKEN = "no admin token: give --admin-token (or $GPUYANTRA_ADMIN_TOKEN, or keep it in <state>/admin-token)"


def _client(args: argparse.Namespace, timeout_s: float) -> AdminClient:
    token = config.find_admin_token(args.admin_token)
    if not token:
        raise ServerError("Unauthorized", NO_TOKEN)
    return AdminClient(args.server or config.server_url(), token, timeout_s=timeout_s)


def _failed(exc: ServerError, args: argparse.Namespace) -> int:
    """One line on stderr, exit 1 (--debug: the traceback)."""
    if getattr(args, "debug", False):
        raise exc
    hint = "; start it with `gpuyantra serve` or fix --server" if exc.kind == "ServerUnreachable" else ""
    print(f"gpuyantra kernels: {str(exc).splitlines()[0]}{hint}", file=sys.stderr)
    return 1


def _list(args: argparse.Namespace) -> int:
    try:
        active = active_kernels(_client(args, LIST_TIMEOUT_S))
    except ServerError as exc:
        return _failed(exc, args)
    if args.json:
        print(json.dumps([record.to_dict() for record in active], indent=2))
        return 0
    if not active:
        print("no kernels swapped in", file=sys.stderr)
        return 0
    print(f"{'swap id':22} {'op':14} {'module class':22} {'modules':>7} {'calls':>7} {'fallbacks':>9}  committed")
    for k in active:
        print(
            f"{k.swap_id:22} {k.op:14} {k.module_class or '-':22} {k.modules:>7} "
            f"{k.calls:>7} {k.fallbacks:>9}  {when(k.committed_at)}"
        )
    return 0


def _rollback(args: argparse.Namespace) -> int:
    try:
        done = rollback(_client(args, ROLLBACK_TIMEOUT_S), args.target)
    except ServerError as exc:
        return _failed(exc, args)
    for record in done:
        print(f"rolled back {record.swap_id} ({record.op}, {record.modules} module(s))")
    return 0


def when(stamp: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if isinstance(stamp, (int, float)) else "-"
