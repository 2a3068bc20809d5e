"""Where a timing turn's seconds go: bench_shape with every baseline cached, variants of rounds/reps."""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
import torch

import gpuyantra.verifier.bench as bench
from gpuyantra.candidate import load_candidate, read_op, read_source
from gpuyantra.verifier.cases import Case, make_case
from gpuyantra.verifier.contract import check_contract, resolve_family
from gpuyantra.verifier.static import check_source

path = "gpuyantra/kernels/rms_norm.py"
source = read_source(path)
family, _ = resolve_family(read_op(source))
report = check_source(source, path, family)
contract = check_contract(report, None)
specs = contract.param_specs
entry = load_candidate(path).entry
dtype = "bfloat16"
shapes = [[1, 1536], [4096, 1536]]
bench.float32_as_float32()
out = {}
# baselines once, then cached
cached = {}
for s in shapes:
    row = bench.bench_shape(contract.family, entry, s, dtype, specs, None)
    cached["x".join(map(str, s))] = {k: row[k] for k in ("eager_us", "eager_launch_us", "compile_us", "compile_ro_us")}
    print(
        "baseline",
        s,
        {k: row.get(k) for k in ("kernel_us", "eager_us", "compile_us", "compile_ro_us")},
        row["seconds"],
        flush=True,
    )


def turn(tag):
    t0 = time.perf_counter()
    rows = []
    for s in shapes:
        t = time.perf_counter()
        row = bench.bench_shape(contract.family, entry, s, dtype, specs, cached["x".join(map(str, s))])
        row["seconds"]["total"] = round(time.perf_counter() - t, 4)
        rows.append(row)
    wall = time.perf_counter() - t0
    return wall, [(r["kernel_us"], r["seconds"]) for r in rows]


variants = {
    "now": dict(ROUNDS=3, MAX_REPS=100, MAX_WARMUP=50),
    "r1": dict(ROUNDS=1, MAX_REPS=100, MAX_WARMUP=50),
    "r1w10": dict(ROUNDS=1, MAX_REPS=100, MAX_WARMUP=10),
    "r1x200": dict(ROUNDS=1, MAX_REPS=200, MAX_WARMUP=10),
}
orig = {k: getattr(bench, k) for k in ("ROUNDS", "MAX_REPS", "MAX_WARMUP")}
res = {k: [] for k in variants}
for _ in range(8):
    for name, v in variants.items():
        for k, val in v.items():
            setattr(bench, k, val)
        time.sleep(0.02)
        wall, rows = turn(name)
        res[name].append({"wall": wall, "us": [r[0] for r in rows], "sec": [r[1] for r in rows]})
for k, v in orig.items():
    setattr(bench, k, v)
for name, runs in res.items():
    walls = [r["wall"] for r in runs]
    us0 = [r["us"][0] for r in runs]
    us1 = [r["us"][1] for r in runs]
    print(
        name,
        f"wall median {statistics.median(walls):.4f} min {min(walls):.4f}",
        f"kernel_us[1x1536] med {statistics.median(us0):.3f} spread {min(us0):.3f}-{max(us0):.3f}",
        f"kernel_us[4096x1536] med {statistics.median(us1):.3f} spread {min(us1):.3f}-{max(us1):.3f}",
        flush=True,
    )
    print("   seconds", runs[-1]["sec"])
# pieces
s = shapes[1]
t = time.perf_counter()
sets = [make_case(contract.family, Case(-1, "bench", dtype, tuple(s), 1000 + k, 1.0), specs, "cuda") for k in range(4)]
torch.cuda.synchronize()
print("make 4 sets %.4f" % (time.perf_counter() - t))
t = time.perf_counter()
flush = torch.empty(bench.L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
torch.cuda.synchronize()
print("flush alloc %.4f" % (time.perf_counter() - t))
t = time.perf_counter()
torch.cuda.empty_cache()
print("empty_cache %.4f" % (time.perf_counter() - t))
print("flush_us", bench.flush_us(flush))
json.dump(res, open(os.environ.get("OUT", "/tmp") + "/turn_bench.json", "w"))
