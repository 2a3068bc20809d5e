import cProfile
import io
import itertools
import os
import pstats
import sys
import time

sys.path.insert(0, os.getcwd())
import torch

import gpuyantra.verifier.cases as case_plan
import gpuyantra.verifier.judge as judge
from gpuyantra.ops import get_op
from gpuyantra.verifier.judge import OutputValues, References

family = get_op("rms_norm")
specs = [{"name": "weight", "kind": "tensor", "shape": ["H"]}, {"name": "eps", "kind": "float", "value": 1e-6}]
live = [[1, 1536], [4096, 1536]]
shapes = case_plan.correctness_shapes("cuda", live, family)
cases = case_plan.plan("cuda", shapes, ["bfloat16"], recheck=True, stress=case_plan.stress_shapes("cuda", family))
print("cases", len(cases), "shapes", shapes)
math = family.eager or family.reference
chunks = []
for _, group in itertools.groupby(cases, key=lambda c: (c.phase, c.dtype, c.shape)):
    chunk = {}
    for case in group:
        a, p = case_plan.make_case(family, case, specs, "cuda")
        out = math(*a, **p)
        chunk[f"{case.id}:0"] = out if isinstance(out, torch.Tensor) else out[0]
    chunks.append(chunk)
torch.cuda.synchronize()
print("chunks", len(chunks), "MiB", sum(t.numel() * t.element_size() for c in chunks for t in c.values()) / 2**20)


def run():
    values = OutputValues(family, cases, References(family, specs, "cuda"))
    for chunk in chunks:
        values.consume(chunk)
    assert not [v for v in values.values.values() if v.findings]
    return values


for i in range(3):
    w, c = time.perf_counter(), time.thread_time()
    v = run()
    cache = judge._reference_cache("cuda")
    print(
        f"run {i}: wall {time.perf_counter() - w:.4f} cpu {time.thread_time() - c:.4f} settles {v.settles}",
        f"cache hits {cache.hits} misses {cache.misses} MiB {cache.nbytes / 2**20:.0f}",
    )
pr = cProfile.Profile()
pr.enable()
run()
pr.disable()
s = io.StringIO()
st = pstats.Stats(pr, stream=s)
st.sort_stats("tottime").print_stats(30)
st.sort_stats("cumtime").print_stats(40)
print(s.getvalue())
