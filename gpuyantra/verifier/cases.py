"""The correctness plan: which shapes, dtypes, seeds and input distributions a candidate meets.

Parent and sandbox child both build every case from (shape, dtype, seed, scale) with the same
deterministic CPU generator, so the parent recomputes the exact inputs and judges the child's
outputs against its own float64 reference; nothing the child reports about values is trusted.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch

SEEDS = (0, 1, 2, 3, 4)
RECHECK_SEEDS = (101,)
# x1, x3, x0.01 and negated: scale-dependent bugs (eps misuse), sign bugs, all-positive hacks.
SCALES = (1.0, 3.0, 0.01, -1.0)

# Hidden shapes the candidate never sees in advance: non-power-of-two H, one row, many rows, 3-D.
# The CPU set is small because Triton's interpreter runs every program in Python.
HIDDEN_SHAPES = {
    "cpu": [[1, 1000], [3, 64], [67, 96], [2, 3, 64]],
    "cuda": [[1, 96], [3, 1000], [67, 4096], [4099, 3000], [2, 5, 64]],
}
DEFAULT_BENCH_SHAPES = [[1, 4096], [2048, 4096]]
DEFAULT_DTYPES = {"cpu": ["float32", "float16"], "cuda": ["float16", "bfloat16", "float32"]}
CPU_MAX_ROWS = 64  # live shapes are capped to this many rows under the interpreter
CUDA_MAX_ELEMENTS = 2**24  # live shapes are capped to this many output elements for correctness on CUDA

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}


@dataclass(frozen=True)
class Case:
    id: int
    phase: str  # "main" or "recheck" (after the timed runs)
    dtype: str
    shape: tuple[int, ...]
    seed: int
    scale: float

    def describe(self) -> str:
        return (f"shape {list(self.shape)} {self.dtype} seed {self.seed} "
                f"inputs x{self.scale:g}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = list(self.shape)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Case":
        return cls(id=int(data["id"]), phase=str(data["phase"]), dtype=str(data["dtype"]),
                   shape=tuple(int(d) for d in data["shape"]), seed=int(data["seed"]),
                   scale=float(data["scale"]))


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}") from None


def correctness_shapes(device: str, live: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """Live shapes first (rows capped on CPU), then the hidden ones, without duplicates."""
    shapes: list[list[int]] = []
    hidden = [list(s) for s in HIDDEN_SHAPES[device]]
    for shape in [list(s) for s in live or []] + hidden:
        shape = [int(d) for d in shape]
        if device == "cpu" and len(shape) >= 2 and shape not in hidden:
            rows = 1
            for d in shape[:-1]:
                rows *= d
            if rows > CPU_MAX_ROWS:
                shape = [CPU_MAX_ROWS, shape[-1]]
        if device != "cpu" and shape not in hidden:
            shape = cap_elements(shape, CUDA_MAX_ELEMENTS)
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def cap_elements(shape: list[int], limit: int) -> list[int]:
    """Shrink the leading dimension so one output stays under `limit` elements: every check's
    output is saved for the parent to judge, and huge live shapes (32768 x 4096 and up) times
    seeds x distributions would overflow the sandbox's file-size limit. The benchmark layer still
    times the full live shapes."""
    inner = 1
    for dim in shape[1:]:
        inner *= dim
    if shape[0] * inner <= limit:
        return shape
    return [max(1, limit // max(inner, 1)), *shape[1:]]


def plan(device: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[str], seeds: Sequence[int] = SEEDS,
         recheck: bool = False) -> list[Case]:
    """Every case, grouped by (phase, dtype, shape) so outputs of one group stay alive together."""
    cases: list[Case] = []
    for dtype in dtypes:
        for shape in shapes:
            for seed in seeds:
                for scale in SCALES:
                    cases.append(Case(len(cases), "main", dtype, tuple(shape), seed, scale))
    if recheck:
        for shape in shapes:
            for seed in RECHECK_SEEDS:
                for scale in SCALES:
                    cases.append(Case(len(cases), "recheck", dtypes[0], tuple(shape), seed, scale))
    return cases


def _generator(case: Case) -> torch.Generator:
    key = f"{case.seed}|{list(case.shape)}|{case.dtype}|{case.scale!r}".encode()
    return torch.Generator().manual_seed(zlib.crc32(key) + 7919 * case.seed)


def make_case(family: Any, case: Case, param_specs: Sequence[dict[str, Any]], device: str | torch.device = "cpu",
              ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """(activations, params) for one case: random inputs, freshly randomized parameters."""
    dtype = dtype_of(case.dtype)
    rows, hidden = tuple(case.shape[:-1]), int(case.shape[-1])
    generator = _generator(case)
    activations = tuple(family.make_activations(rows, hidden, dtype, "cpu", generator, case.scale))
    params: dict[str, Any] = {}
    for spec in param_specs:
        if spec["kind"] == "tensor":
            shape = [hidden if d == "H" else int(d) for d in spec["shape"]]
            # Never weight = 1, bias = 0: random values around 0.3 with both signs.
            values = torch.randn(shape, generator=generator, dtype=torch.float32) * 0.5 + 0.3
            params[spec["name"]] = values.to(dtype)
        else:
            params[spec["name"]] = spec["value"]
    if str(device) != "cpu":
        activations = tuple(a.to(device) for a in activations)
        params = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
    return activations, params


def float64_reference(family: Any, activations: Sequence[torch.Tensor], params: dict[str, Any]) -> list[torch.Tensor]:
    """The family's reference on float64 copies of exactly these inputs, as a list of outputs."""
    acts = [a.detach().to("cpu", torch.float64) for a in activations]
    kw = {k: v.detach().to("cpu", torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
          for k, v in params.items()}
    with torch.no_grad():
        out = family.reference(*acts, **kw)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def expected_outputs(family: Any, activations: Sequence[torch.Tensor], params: dict[str, Any],
                     ) -> tuple[bool, list[tuple[torch.dtype, tuple[int, ...]]]]:
    """(returns a tuple?, [(dtype, shape)] per output) of the reference in the native dtypes."""
    try:
        with torch.no_grad():
            out = family.reference(*activations, **params)
    except Exception:  # noqa: BLE001 - a dtype the CPU kernels lack: shapes and dtypes from meta tensors
        def meta(t: Any) -> Any:
            return torch.empty(t.shape, dtype=t.dtype, device="meta") if isinstance(t, torch.Tensor) else t

        with torch.no_grad():
            out = family.reference(*[meta(a) for a in activations], **{k: meta(v) for k, v in params.items()})
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return isinstance(out, (tuple, list)), [(o.dtype, tuple(o.shape)) for o in outs]
