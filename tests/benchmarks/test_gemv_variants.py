"""benchmarks/gemv_variants.py --dry-run: every decode-GEMV variant (static unroll, split-K with the
semaphore reduction, dynamic loop) on tiny shapes in Triton's interpreter, checked against F.linear.
Timings mean nothing here; that every planned config ran and was right does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("static", "splitk_sem", "loop")
TOL = 1e-2  # bf16 output: one rounding (the interpreter truncates: up to 2^-7 of the largest |y|)


def test_gemv_variants_dry_run(tmp_path):
    out = tmp_path / "gemv_variants.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gemv_variants.py"), "--dry-run", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] and result["copy_bandwidth_gbs"] > 0 and result["dtype"] == "bfloat16"
    assert {(r["shape"], r["m"]) for r in result["rows"]} == {
        (name, m) for name in ("tiny", "tiny_bias") for m in (1, 3)
    }
    for row in result["rows"]:
        where = (row["shape"], row["m"])
        for method in ("cublas", "template", "template_start"):
            assert row[method]["us"] > 0 and row[method]["rel_err"] < TOL, (where, method, row[method])
        assert set(row["variants"]) == set(VARIANTS)
        for variant, bucket in row["variants"].items():
            assert not (bucket["failed"] or bucket["rejected"] or bucket["skipped"]), (where, variant, bucket)
            assert len(bucket["timed"]) == bucket["planned"] >= 2, (where, variant)
            for record in bucket["timed"]:
                assert record["us"] > 0 and record["rel_err"] < TOL, (where, variant, record)
            assert bucket["best"]["us"] == min(r["us"] for r in bucket["timed"])
    # The configs cover what could go wrong: a ragged K (130), a partial N block (20 of 8 or 16),
    # an uneven split with masked steps, and every num_stages.
    tiny_bias = next(r for r in result["rows"] if r["shape"] == "tiny_bias")
    splits = {rec["config"]["split"] for rec in tiny_bias["variants"]["splitk_sem"]["timed"]}
    assert {2, 3, 4} <= splits
    stages = {rec["config"]["stages"] for rec in tiny_bias["variants"]["loop"]["timed"]}
    assert stages == {1, 3, 4}
