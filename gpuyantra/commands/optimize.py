"""`gpuyantra optimize --server URL`: start a campaign against a running server."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuyantra import config
from gpuyantra.rewards import REWARD_ACCEPTED, REWARD_MAX
from gpuyantra.server_client import ServerError, check_reachable

if TYPE_CHECKING:
    from temporalio.client import WorkflowHandle

    from gpuyantra.campaign.records import CampaignInput


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "optimize",
        help="start an optimization campaign against a running server",
        description="Start the OptimizeCampaign workflow on Temporal against a running `gpuyantra serve` process.",
    )
    parser.add_argument(
        "--server", required=True, type=server_url, help="the serving process, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument("--ops", type=comma_list, default=None, help="op families to optimize, comma separated")
    parser.add_argument(
        "--min-reward",
        type=int,
        choices=range(REWARD_ACCEPTED, REWARD_MAX + 1),
        default=REWARD_MAX,
        help="least verifier reward a kernel needs to be deployed (CPU-only setups: 1)",
    )
    parser.add_argument("--max-iterations", type=iterations, default=6)
    parser.add_argument(
        "--max-targets",
        type=targets,
        default=None,
        help="without --ops: at most this many of the targets whose estimated gain is above the measured noise "
        "(default: all of them)",
    )
    parser.add_argument(
        "--require-approval", action="store_true", help="wait for the `approve` signal before each deployment"
    )
    parser.add_argument(
        "--redeploy-rolled-back",
        action="store_true",
        help="deploy a kernel even if serving this model rolled the same kernel back for speed before",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="where candidates are verified (default: the GPU worker's device)",
    )
    parser.add_argument("--temporal", default=None, metavar="HOST:PORT")
    parser.add_argument("--wait", action="store_true", help="follow the campaign to its end")
    parser.add_argument("--json", action="store_true", help="print the campaign result as JSON, last on stdout")
    parser.set_defaults(handler=run)


def server_url(text: str) -> str:
    """An http:// or https:// URL with a host; `127.0.0.1:8000` alone is a usage error naming the fix."""
    from urllib.parse import urlsplit

    parts = urlsplit(text.strip())
    if parts.scheme in ("http", "https") and parts.hostname:
        return text.strip()
    if "://" not in text and text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} has no scheme: give http://{text.strip()}")
    raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL with a host")


def comma_list(text: str) -> list[str]:
    from gpuyantra.campaign_client import unknown_ops

    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            "no op names given: name at least one (--ops rms_norm,silu_mul), or leave --ops out "
            "for the profile's top targets"
        )
    unknown = unknown_ops(names)
    if unknown:
        raise argparse.ArgumentTypeError(unknown)
    return names


def iterations(text: str) -> int:
    return bounded(text, "max_iterations")


def targets(text: str) -> int:
    return bounded(text, "max_targets")


def bounded(text: str, field: str) -> int:
    from gpuyantra.campaign.inputs import RANGES  # the workflow's own bounds: refuse here what it would refuse

    value, (low, high) = int(text), RANGES[field]
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
    return value


def run(args: argparse.Namespace) -> int:
    """Start the campaign. With --wait: its id, Web UI link and CLI commands first, one line per
    progress change, then a summary (or with --json the result, last on stdout; the other lines then
    go to stderr) and the path of its HTML report. Ctrl-C stops following, not the campaign (130)."""
    from gpuyantra.campaign.records import CampaignInput
    from gpuyantra.campaign_client import follow_commands, new_workflow_id
    from gpuyantra.server_client import served_model

    try:
        check_reachable(args.server)
    except ServerError as exc:
        print(f"gpuyantra optimize: {exc}; start it with `gpuyantra serve` or fix --server", file=sys.stderr)
        return 1
    from gpuyantra.preflight import reward_problem, served_device

    problem = reward_problem(served_device(args.server), args.device, args.min_reward)
    if problem:
        print(f"gpuyantra optimize: {problem}", file=sys.stderr)
        return 1
    params = CampaignInput(
        server_url=args.server,
        ops=args.ops,
        min_reward=args.min_reward,
        max_iterations=args.max_iterations,
        require_approval=args.require_approval,
        redeploy_rolled_back=args.redeploy_rolled_back,
        device=args.device,
        **({} if args.max_targets is None else {"max_targets": args.max_targets}),
    )
    address = args.temporal or config.temporal_address()
    workflow_id = new_workflow_id(args.server, served_model(args.server), args.ops)
    say = (
        (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else (lambda line: print(line, flush=True))
    )
    started: list[str] = []
    try:
        result = asyncio.run(_campaign(address, params, workflow_id, args.wait, say, started))
    except KeyboardInterrupt:
        if not started:
            print("\ngpuyantra optimize: interrupted before the campaign started", file=sys.stderr)
            return 130
        show, cancel = follow_commands(address, workflow_id)
        print(
            f"\ngpuyantra optimize: stopped following; campaign {workflow_id} keeps running.\n"
            f"  follow: {show} --follow\n  cancel: {cancel}",
            file=sys.stderr,
            flush=True,
        )
        return 130
    except Exception as exc:  # noqa: BLE001 - a refusal or a failed workflow: one line, not a traceback
        if getattr(args, "debug", False):
            raise
        print(f"gpuyantra optimize: {failure_line(exc)}", file=sys.stderr)
        return 1
    if args.wait:
        from gpuyantra.report import text_summary, write_report

        if not args.json:
            for line in text_summary(result):
                say(line)
        reports = config.reports_dir()
        saved = reports / f"{workflow_id}.json"
        saved.write_text(json.dumps(result, indent=2))
        say(f"Result: {saved}")
        say(f"Report: {write_report(result, reports / f'{workflow_id}.html')}")
        if not args.json:
            return 0
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def _campaign(
    address: str, params: CampaignInput, workflow_id: str, wait: bool, say: Callable[[str], None], started: list[str]
) -> dict[str, Any]:
    from gpuyantra.campaign_client import connect, follow, follow_commands, launch, started_answer, web_ui_link

    client = await connect(address)
    handle = await launch(client, params, workflow_id)
    started.append(workflow_id)
    show, cancel = follow_commands(address, workflow_id)
    for line in (
        f"Campaign {workflow_id} started.",
        f"  Web UI: {web_ui_link(address, workflow_id)}",
        f"  show:   {show}",
        f"  cancel: {cancel}",
    ):
        say(line)
    if not wait:
        await past_preflight(handle)
        return started_answer(workflow_id, params)
    return await follow(handle, say)


PREFLIGHT_WITHIN_S = 60.0  # the preflight answers in seconds; a campaign without a CPU worker never does


async def past_preflight(handle: WorkflowHandle, within_s: float = PREFLIGHT_WITHIN_S) -> None:
    """Return once the campaign is past its preflight (or still in it after `within_s`: no worker has
    taken it yet); raise the campaign's failure when the preflight refused it."""
    from temporalio.client import WorkflowExecutionStatus

    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            await handle.result()  # raises the failure; a campaign that completed is past it
            return
        try:
            stage = (await handle.query("progress")).get("stage")
        except Exception:  # noqa: BLE001 - no workflow task has run yet
            stage = None
        if stage not in (None, "starting", "preflight"):
            return
        await asyncio.sleep(0.5)


REFUSALS = ("InvalidInput", "CampaignConflict", "PreflightFailed", "UntrustedServer")  # said in one line


def failure_line(exc: BaseException) -> str:
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    from gpuyantra.campaign_client import CampaignRefused, TemporalUnreachable

    if isinstance(exc, (TemporalUnreachable, CampaignRefused)):
        return str(exc)
    cause = exc.cause if isinstance(exc, WorkflowFailureError) else None
    if isinstance(cause, ApplicationError) and cause.type in REFUSALS:
        return cause.message.removeprefix("preflight_campaign failed: ")
    return f"campaign failed: {describe_failure(exc)}"


def describe_failure(exc: BaseException) -> str:
    messages = []
    cause: BaseException | None = exc
    while cause is not None:
        messages.append(str(cause))
        cause = cause.__cause__
    return " <- ".join(m for m in messages if m)
