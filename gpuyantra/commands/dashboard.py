"""`gpuyantra dashboard`: a live page of campaigns, served speed, kernels swapped in and skills."""

from __future__ import annotations

import argparse
import sys

from gpuyantra import config
from gpuyantra.commands.serve import port_number

DEFAULT_PORT = 8300


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="serve a live dashboard: campaigns, served tokens/s and latency, kernels (rollback), skills",
        description="Serve one page that polls Temporal (campaigns and their progress), the serving "
        "process (/metrics, kernels swapped in, rollback) and the skill library. On a loopback address "
        "reading needs no token; rolling back always needs the admin token, and on any other address "
        "reading needs it too.",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (default: 127.0.0.1; any non-loopback address makes reading need the admin token)",
    )
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    add_server_argument(parser)
    add_temporal_arguments(parser)
    add_token_argument(parser)
    parser.add_argument("--qdrant-path", help="local Qdrant folder (default: GPUYANTRA_QDRANT_PATH or <state>/qdrant)")
    parser.add_argument("--qdrant-url", help="Qdrant server URL (default: GPUYANTRA_QDRANT_URL)")
    parser.set_defaults(handler=run)


def add_server_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="the serving process (default: $GPUYANTRA_SERVER_URL, else http://127.0.0.1:8000)",
    )


def add_temporal_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--temporal",
        default=None,
        metavar="HOST:PORT",
        help="Temporal frontend address (default: $TEMPORAL_ADDRESS or localhost:7233)",
    )
    parser.add_argument(
        "--namespace", default=None, help="Temporal namespace (default: $TEMPORAL_NAMESPACE, else default)"
    )


def add_token_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin-token",
        default=None,
        help="the server's admin token (default: $GPUYANTRA_ADMIN_TOKEN, else the one `up` kept in "
        "<state>/admin-token)",
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gpuyantra.dashboard import Settings, create_app, is_loopback
    from gpuyantra.processes import port_open

    token = config.find_admin_token(args.admin_token)
    if not is_loopback(args.host) and not token:
        print(
            f"gpuyantra dashboard: --host {args.host} is not a loopback address, so reading needs the admin "
            "token too: give --admin-token (or $GPUYANTRA_ADMIN_TOKEN, or keep it in <state>/admin-token)",
            file=sys.stderr,
        )
        return 2
    if port_open("127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host, args.port):
        print(f"gpuyantra dashboard: port {args.port} is already in use: pass another --port", file=sys.stderr)
        return 1
    settings = Settings(
        server_url=args.server or config.server_url(),
        temporal_address=args.temporal or config.temporal_address(),
        namespace=args.namespace or config.temporal_namespace(),
        admin_token=token,
        qdrant_url=args.qdrant_url or (None if args.qdrant_path else config.qdrant_url()),
        qdrant_path=args.qdrant_path or str(config.qdrant_path()),
        host=args.host,
    )
    reads = "reading needs the admin token" if not is_loopback(args.host) else "reading needs no token"
    actions = "rollback needs the admin token" if token else "rollback disabled (no admin token)"
    print(
        f"gpuyantra dashboard: http://{_url_host(args.host)}:{args.port} ({reads}; {actions}); server "
        f"{settings.server_url}, Temporal {settings.temporal_address} ({settings.namespace})",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
