"""`gpuyantra report CAMPAIGN_ID`: a campaign's result as one self-contained HTML page."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

from gpuyantra import config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write an offline HTML report of a finished campaign",
        description="Fetch a finished campaign's result from Temporal (or read it "
        "from a saved JSON file) and write one HTML page with inline SVG "
        "charts and no external reference.",
    )
    parser.add_argument("campaign_id", nargs="?", metavar="CAMPAIGN_ID", help="the campaign's workflow id")
    parser.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="where to write the page (default: <state folder>/reports/<id>.html)",
    )
    parser.add_argument("--temporal", default=None, metavar="HOST:PORT")
    parser.add_argument(
        "--from-json",
        default=None,
        metavar="FILE",
        help="a saved campaign result (optimize --json, temporal workflow result): no Temporal",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gpuyantra.campaign_client import TemporalUnreachable
    from gpuyantra.report import ReportError, fetch_result, load_result, write_report

    if not args.campaign_id and not args.from_json:
        print(
            "gpuyantra report: error: give CAMPAIGN_ID or --from-json FILE (usage: gpuyantra report --help)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.from_json:
            result = load_result(Path(args.from_json))
        else:
            result = asyncio.run(fetch_result(args.temporal or config.temporal_address(), args.campaign_id))
    except (ReportError, TemporalUnreachable) as exc:
        print(f"gpuyantra report: {exc}", file=sys.stderr)
        return 1
    name = args.campaign_id or result.get("workflow_id") or Path(args.from_json).stem
    out = Path(args.out) if args.out else config.reports_dir() / (re.sub(r"[^\w.+-]+", "-", str(name)) + ".html")
    print(write_report(result, out))
    return 0
