"""Verify every template and every plan-class corpus kernel on a GPU; print each verdict and its time.

    python benchmarks/verify_plan_gpu.py [--device cuda] [--only NAME ...] [--skip-templates]

Templates (`gpuyantra/kernels/*.py`) run the default plan (three dtypes, benchmark included) three
times in one process: once cold (kernels and baselines compile), then warm without the plan classes
(`GPUYANTRA_PLAN_CLASSES=0`: the plan as it was before them) and warm with them, so the cost of the
classes reads directly as the ratio of the two warm verdicts (the warm ones find the templates'
kernels in the shared compiler cache, which only trusted processes write). Corpus kernels
(`tests/verifier/plan_corpus.py`) run the default dtypes without the benchmark; each line says
whether the verdict matches the table (wrong kernels rejected with their rule, honest ones accepted).
Last, the compiler caches (`gpuyantra.verifier.compiler_cache`): the shared Triton cache holds the
templates' kernels, and a candidate's child that tries to write it is blocked on this machine.
Under 8 minutes on one H100/H200. Exit status 1 when any verdict or check differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuyantra.verifier import run_verification  # noqa: E402
from tests.verifier.plan_corpus import CORPUS, Entry  # noqa: E402

TEMPLATES = sorted(p for p in (ROOT / "gpuyantra" / "kernels").glob("*.py") if p.name != "__init__.py")


def _verdict_line(name: str, verdict: Any, seconds: float, expected: str) -> dict[str, Any]:
    rules = sorted({f"{f.layer}/{f.rule}" for f in verdict.failures})
    return {
        "name": name,
        "verdict": "accepted" if verdict.accepted else "rejected",
        "expected": expected,
        "rules": rules,
        "reward": verdict.reward,
        "checks": verdict.checks,
        "seconds": round(seconds, 2),
        "plan_classes": verdict.plan_classes,
        "first_failure": verdict.failures[0].message[:240] if verdict.failures else "",
    }


def _timed(path: Path, **knobs: Any) -> tuple[Any, float]:
    started = time.monotonic()
    verdict = run_verification(path, **knobs)
    return verdict, time.monotonic() - started


def _with_classes(enabled: bool) -> None:
    os.environ["GPUYANTRA_PLAN_CLASSES"] = "1" if enabled else "0"


def run_templates(device: str, only: set[str]) -> list[dict[str, Any]]:
    rows = []
    for path in TEMPLATES:
        if only and path.stem not in only:
            continue
        _with_classes(True)
        _, cold = _timed(path, device=device)
        _with_classes(False)
        _, before = _timed(path, device=device)
        _with_classes(True)
        verdict, after = _timed(path, device=device)
        row = _verdict_line(f"template:{path.stem}", verdict, after, "accepted")
        row.update(cold_s=round(cold, 2), warm_without_classes_s=round(before, 2), ratio=round(after / before, 2))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def run_corpus(device: str, only: set[str]) -> list[dict[str, Any]]:
    rows = []
    _with_classes(True)
    for entry in CORPUS:
        if only and entry.name not in only:
            continue
        knobs = {k: v for k, v in entry.knobs.items() if k != "dtypes"}  # every dtype on a GPU
        verdict, seconds = _timed(entry.path, device=device, benchmark=False, **knobs)
        rows.append(_verdict_line(entry.name, verdict, seconds, _expected(entry)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def run_cache_check(device: str) -> list[dict[str, Any]]:
    """The shared Triton cache after the templates ran, and a candidate planting a file in it."""
    import tempfile

    from gpuyantra.config import state_dir
    from gpuyantra.verifier import compiler_cache

    shared = compiler_cache.shared_dirs(state_dir())[0]
    entries = len([p for p in shared.iterdir() if p.is_dir()]) if shared.is_dir() else 0
    cheat = (ROOT / "tests" / "verifier" / "candidates" / "cheat_writes_state.py").read_text()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cheat_writes_shared_cache.py"
        path.write_text(cheat.replace("__TARGET__", str(shared)))
        verdict, seconds = _timed(path, device=device, benchmark=False, skip_static=True, dtypes=["float16"])
    message = " ".join(f.message for f in verdict.failures)
    planted = (shared / "planted.py").exists()
    row = _verdict_line("cache:candidate-writes-shared", verdict, seconds, "rejected sandbox/import-failed")
    row.update(blocked="PROBE blocked" in message and not planted, shared_entries=entries)
    print(json.dumps(row), flush=True)
    return [row]


def _expected(entry: Entry) -> str:
    return "accepted" if entry.rule is None else f"rejected correctness/{entry.rule}"


def _matches(row: dict[str, Any]) -> bool:
    if "blocked" in row:  # the cache check: blocked, and the templates' kernels were kept
        return bool(row["blocked"]) and row["shared_entries"] > 0
    if row["expected"] == "accepted":
        return row["verdict"] == "accepted"
    return row["verdict"] == "rejected" and row["expected"].split(" ", 1)[1] in row["rules"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", nargs="*", default=[], help="template stems or corpus names")
    parser.add_argument("--skip-templates", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("GPUYANTRA_STATE_DIR", "/tmp/gy-plan-state")
    only = set(args.only)
    started = time.monotonic()
    rows = [] if args.skip_templates else run_templates(args.device, only)
    rows += run_corpus(args.device, only)
    if not args.skip_templates and args.device == "cuda":
        rows += run_cache_check(args.device)
    print("\nname                                   verdict   expected                               seconds  ratio")
    bad = 0
    for row in rows:
        ok = _matches(row)
        bad += not ok
        ratio = f"{row['ratio']:.2f}" if "ratio" in row else ""
        print(
            f"{row['name']:<38} {row['verdict']:<9} {row['expected']:<38} {row['seconds']:>7.1f}  {ratio:>5}"
            f"{'' if ok else '  MISMATCH ' + ','.join(row['rules'])}"
        )
    print(f"\n{len(rows)} verdicts, {bad} mismatches, {time.monotonic() - started:.0f} s in all")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
