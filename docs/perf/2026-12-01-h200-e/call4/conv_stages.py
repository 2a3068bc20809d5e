"""Conv candidates against Model in float64 on the GPU, at several sizes and launch plans."""

import copy
import operator
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from gpuyantra.candidate import load_candidate
from gpuyantra.kernelbench.problems import load_module
from gpuyantra.verifier.bench import float32_as_float32

float32_as_float32()
CASES = {
    "63_conv_standard_2D__square_input__square_kernel": (
        "level1",
        [(1, 16, 32, 32), (2, 16, 64, 64), (2, 16, 256, 256), (16, 16, 1024, 1024)],
    ),
    "10_ConvTranspose2d_MaxPool_Hardtanh_Mean_Tanh": (
        "level2",
        [(1, 64, 16, 16), (2, 64, 64, 64), (128, 64, 256, 256)],
    ),
}
for name, (level, shapes) in CASES.items():
    mod = load_module(Path(f".kb/{level}/{name}.py"))
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).cuda().eval()
    ref_model = copy.deepcopy(model).double()
    for variant in ("default", "interp-plan", "stages1", "split1"):
        cand = load_candidate(f".kb/cands/{name}.py")
        m = cand.module
        orig = m._mm_plan
        if variant == "interp-plan":
            m._mm_plan = lambda b, mm, n, k, dt, interp, loads=2, _o=orig: _o(b, mm, n, k, dt, True, loads)
        elif variant == "stages1":
            m.MM_STAGES = 1
        elif variant == "split1":
            m.MM_SPLIT_K = 1
        bound = {b["kernel_param"]: operator.attrgetter(b["module_attr"])(model) for b in cand.adapter}
        for shape in shapes:
            x = torch.rand(shape, device="cuda")
            try:
                with torch.no_grad():
                    out = cand.entry(x, **bound)
                    torch.cuda.synchronize()
                    ref = ref_model(x.double())
                err = (out.double() - ref).abs()
                wrong = (err > 1e-4 + 1e-4 * ref.abs()).float().mean().item()
                shown = f"{name[:24]} {variant:12s} {list(shape)}"
                print(f"{shown} max_err {err.max().item():.3g} wrong {wrong:.4f}", flush=True)
                del out, ref, err
            except Exception as exc:
                print(f"{name[:24]} {variant:12s} {list(shape)} raised {type(exc).__name__}: {exc}", flush=True)
            torch.cuda.empty_cache()
