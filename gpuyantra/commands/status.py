"""`gpuyantra status`: the server, Temporal and the latest campaigns on one screen."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import httpx

from gpuyantra import config
from gpuyantra.commands.dashboard import add_server_argument, add_temporal_arguments, add_token_argument

CAMPAIGNS_SHOWN = 10


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="one screen: the serving process, Temporal and the latest campaigns",
        description="Whether the server is ready (model, device, kernels swapped in, tokens/s) and "
        "Temporal reachable, and the latest campaigns with their progress. Exit 1 when either is down.",
    )
    add_server_argument(parser)
    add_temporal_arguments(parser)
    add_token_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    address = args.temporal or config.temporal_address()
    namespace = args.namespace or config.temporal_namespace()
    token = config.find_admin_token(args.admin_token)
    servers = [server_summary(url, token) for url in server_urls(args.server)]
    answering = [server for server in servers if server["ok"]]
    summary: dict[str, Any] = {
        "server": (answering or servers)[0],  # the first that answers: what one-server readers show
        "servers": servers,
        "temporal": asyncio.run(temporal_summary(address, namespace)),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        lines = [line for server in servers for line in server_lines(server)]
        print("\n".join(lines + temporal_lines(summary["temporal"])))
    return 0 if answering and summary["temporal"]["ok"] else 1


def server_urls(flag: str | None) -> list[str]:
    """--server alone when given; else the configured URL ($GPUYANTRA_SERVER_URL, else :8000) and
    every server running from this state folder (`serve` registers itself in `<state>/servers/`)."""
    if flag:
        return [flag]
    from gpuyantra.campaign.inputs import server_key

    urls, seen = [], set()
    for url in [config.server_url(), *registered_server_urls()]:
        if server_key(url) not in seen:
            seen.add(server_key(url))
            urls.append(url)
    return urls


def registered_server_urls() -> list[str]:
    """The `url` of each `<state>/servers/*.json` (one per running `serve` of this state folder)."""
    urls = []
    for path in sorted((config.state_dir() / "servers").glob("*.json")):
        try:
            url = json.loads(path.read_text()).get("url")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            urls.append(url)
    return urls


def server_summary(url: str, token: str | None) -> dict[str, Any]:
    """Readiness, kernels swapped in (ops with the token, ids without) and the metrics' figures."""
    from gpuyantra.dashboard.metrics import parse
    from gpuyantra.server_client import AdminClient, ServerError, active_kernels, readiness

    try:
        ready = readiness(url)
    except ServerError as exc:
        return {"url": url, "ok": False, "error": str(exc).splitlines()[0]}
    kernels = [{"swap_id": swap_id, "op": None} for swap_id in ready.get("active_swaps") or []]
    if token:
        try:
            kernels = [
                {"swap_id": k.swap_id, "op": k.op} for k in active_kernels(AdminClient(url, token, timeout_s=5.0))
            ]
        except ServerError:
            pass  # the ids from /readyz still say how many
    try:
        figures = parse(httpx.get(f"{url.rstrip('/')}/metrics", timeout=5.0).text)
    except (httpx.HTTPError, ValueError):
        figures = None
    return {
        "url": url,
        "ok": True,
        "status": ready.get("status"),
        "model": ready.get("model"),
        "device": ready.get("device"),
        "error": ready.get("error"),
        "kernels": kernels,
        "tokens_per_s": figures.tokens_per_s if figures else None,
        "requests_ok": figures.requests_ok if figures else None,
        "requests_error": figures.requests_error if figures else None,
    }


async def temporal_summary(address: str, namespace: str) -> dict[str, Any]:
    from gpuyantra.campaign_client import TemporalUnreachable, connect, list_campaigns, one_line

    try:
        client = await connect(address, namespace=namespace)
        campaigns = await asyncio.wait_for(list_campaigns(client, CAMPAIGNS_SHOWN), 10.0)
    except TemporalUnreachable as exc:
        return {"address": address, "namespace": namespace, "ok": False, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a namespace that does not exist, a dropped connection: one line
        return {"address": address, "namespace": namespace, "ok": False, "error": one_line(exc)}
    return {"address": address, "namespace": namespace, "ok": True, "campaigns": campaigns}


def server_lines(server: dict[str, Any]) -> list[str]:
    if not server["ok"]:
        return [f"server    {server['error']}"]
    if server["status"] != "ready":
        why = f": {server['error']}" if server.get("error") else ""
        return [f"server    {server['url']}: {server['status']}{why}"]
    kernels = ", ".join(f"{k['op']} ({k['swap_id']})" if k.get("op") else str(k["swap_id"]) for k in server["kernels"])
    speed = "" if server["tokens_per_s"] is None else f"; {server['tokens_per_s']:.1f} tokens/s"
    requests = (
        ""
        if server["requests_ok"] is None
        else f", {server['requests_ok']:.0f} request(s) served, {server['requests_error'] or 0:.0f} failed"
    )
    return [
        f"server    {server['url']}: ready, {server['model']} on {server['device']}{speed}{requests}",
        f"kernels   {len(server['kernels'])} swapped in" + (f": {kernels}" if kernels else ""),
    ]


def temporal_lines(temporal: dict[str, Any]) -> list[str]:
    if not temporal["ok"]:
        return [f"temporal  {temporal['error']}"]
    campaigns = temporal["campaigns"]
    running = sum(1 for c in campaigns if c["status"] == "running")
    lines = [
        f"temporal  {temporal['address']} ({temporal['namespace']}): {running} campaign(s) running, "
        f"{len(campaigns) - running} past shown"
    ]
    lines += [f"  {campaign_line(c)}" for c in campaigns]
    return lines


def campaign_line(campaign: dict[str, Any]) -> str:
    """`status id elapsed`, then what it is doing (running) or what it deployed (closed)."""
    head = f"{campaign['status']:<10} {campaign['id']}  {elapsed(campaign['elapsed_s'])}"
    if campaign["status"] != "running":
        deployed = campaign.get("deployed")
        return head + ("" if deployed is None else f"  deployed {deployed}")
    if campaign.get("progress_error"):
        return f"{head}  {campaign['progress_error']}"
    targets = "; ".join(target_text(t) for t in campaign["targets"])
    waiting = f"; {campaign['waiting']}" if campaign.get("waiting") else ""
    return f"{head}  stage {campaign['stage']}" + (f"; {targets}" if targets else "") + waiting


def target_text(target: dict[str, Any]) -> str:
    """`rms_norm:Qwen2RMSNorm verify (iteration 2, best +1)`."""
    details = [f"iteration {target['iteration']}"] if target.get("iteration") else []
    details += [f"best {target['best_reward']:+d}"] if isinstance(target.get("best_reward"), int) else []
    return f"{target['target']} {target['stage']}" + (f" ({', '.join(details)})" if details else "")


def elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
