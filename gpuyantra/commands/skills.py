"""`gpuyantra skills list|show|export|import`: look at the skill library and move it between machines.

The library is the Qdrant folder of `GPUYANTRA_QDRANT_PATH` (default `<state dir>/qdrant`), or
the server of `GPUYANTRA_QDRANT_URL`; `--qdrant-path` / `--qdrant-url` override both. Export and
import use JSON Lines, one skill a line, bandit statistics included.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

QDRANT_TIMEOUT_S = 10.0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "skills",
        help="list, show, export or import the skill library",
        description="The skill library: verified kernels indexed by bottleneck fingerprint (Qdrant).",
    )
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--qdrant-path", help="local Qdrant folder (default: GPUYANTRA_QDRANT_PATH or <state>/qdrant)")
    where.add_argument("--qdrant-url", help="Qdrant server URL (default: GPUYANTRA_QDRANT_URL)")
    sub = parser.add_subparsers(dest="skills_command", metavar="ACTION", required=True)

    p = sub.add_parser("list", parents=[where], help="one line per skill")
    p.add_argument("--op", help="only this op family")
    p.add_argument("--hardware", help="only this hardware class")
    p.add_argument("--json", action="store_true", help="print a JSON array (sources left out)")
    p.set_defaults(handler=_reachable(_list))

    p = sub.add_parser("show", parents=[where], help="one skill in full")
    p.add_argument("id", help="skill id, or a unique prefix of one")
    p.add_argument("--source", action="store_true", help="print only the kernel source")
    p.set_defaults(handler=_reachable(_show))

    p = sub.add_parser("export", parents=[where], help="write the library as JSON Lines")
    p.add_argument("file", help="output .jsonl file ('-' for stdout)")
    p.add_argument("--op", help="only this op family")
    p.set_defaults(handler=_reachable(_export))

    p = sub.add_parser("import", parents=[where], help="upsert the skills of a JSON Lines export")
    p.add_argument("file", help="input .jsonl file")
    p.set_defaults(handler=_reachable(_import))
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def _store(args):
    from gpuyantra.skills import SkillStore

    if args.qdrant_url:  # lock_timeout is also the server client's request timeout: keep the CLI's wait short
        return SkillStore(url=args.qdrant_url, lock_timeout=QDRANT_TIMEOUT_S)
    return SkillStore(path=args.qdrant_path) if args.qdrant_path else SkillStore()


def _reachable(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """One line and exit 1 when the Qdrant server does not answer, instead of a client traceback."""

    def run(args: argparse.Namespace) -> int:
        from qdrant_client.http.exceptions import ResponseHandlingException

        try:
            return handler(args)
        except ResponseHandlingException:
            if getattr(args, "debug", False):
                raise
            from gpuyantra import config

            url = args.qdrant_url or config.qdrant_url()
            print(
                f"gpuyantra skills: cannot reach Qdrant at {url}: start it, or drop --qdrant-url "
                f"(and GPUYANTRA_QDRANT_URL) to use the local folder",
                file=sys.stderr,
            )
            return 1

    return run


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _list(args) -> int:
    skills = _store(args).list(op=args.op, hardware=args.hardware)
    if args.json:
        rows = []
        for s in skills:
            row = s.to_dict()
            row.pop("source", None)
            rows.append(row)
        print(json.dumps(rows, indent=2))
        return 0
    if not skills:
        print("no skills stored", file=sys.stderr)
        return 0
    header = (
        f"{'id':36}  {'op':14} {'hardware':14} {'reward':>6} {'x eager':>8} {'x compile':>9} "
        f"{'pulls':>5} {'mean':>6}  regime / author"
    )
    print(header)
    for s in skills:
        fp = s.fingerprint or {}
        author = (s.provenance or {}).get("author") or "-"
        print(
            f"{s.id:36}  {s.op:14} {s.hardware:14} {_fmt(s.reward, 'g'):>6} {_fmt(s.speedup_vs_eager):>8} "
            f"{_fmt(s.speedup_vs_compile):>9} {s.pulls:>5} {_fmt(s.mean_reward):>6}  "
            f"{fp.get('regime', '-')} / {author}"
        )
    return 0


def _show(args) -> int:
    skill = _store(args).get(args.id)
    if skill is None:
        print(f"no skill with id {args.id!r} (or the prefix is not unique)", file=sys.stderr)
        return 1
    if args.source:
        sys.stdout.write(skill.source)
        return 0
    data = skill.to_dict()
    source = data.pop("source", "")
    data["mean_reward"] = skill.mean_reward
    print(json.dumps(data, indent=2))
    print("--- source ---")
    sys.stdout.write(source if source.endswith("\n") else source + "\n")
    return 0


def _export(args) -> int:
    store = _store(args)
    if args.file == "-":
        for skill in store.list(op=args.op):
            print(json.dumps(skill.to_dict(), sort_keys=True))
        return 0
    count = store.export_jsonl(args.file, op=args.op)
    print(f"exported {count} skill(s) to {args.file}")
    return 0


def _import(args) -> int:
    from gpuyantra.skills.schema import InvalidSkillRecord

    try:
        count = _store(args).import_jsonl(args.file)
    except InvalidSkillRecord as exc:  # the file's content: a usage error, nothing imported
        print(f"gpuyantra skills: import {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"import failed: {exc}", file=sys.stderr)
        return 1
    print(f"imported {count} skill(s) from {args.file}")
    return 0
