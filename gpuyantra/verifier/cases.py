# Over 600 lines: the correctness plan, built identically in parent and child; its parts stay together.
"""The correctness plan: which shapes, dtypes, seeds and input distributions a candidate meets.

Parent and sandbox child both build every case from (shape, dtype, seed, scale, distribution) with
the same deterministic generator — the CPU's on the CPU, the GPU's own (Philox) where the verdict
is for a GPU: parent and child sit on the same device, and drawing 12M-element cases there instead
of on the host is most of what a GPU verdict's correctness phase saved — so the parent recomputes
the exact inputs and judges the child's outputs against its own float64 reference; nothing the
child reports about values is trusted.
"""

from __future__ import annotations

import contextlib
import os
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

SEEDS = (0, 1, 2, 3, 4)
RECHECK_SEEDS = (101,)
# x1, x3, x0.01 and negated: scale-dependent bugs (eps misuse), sign bugs, all-positive hacks.
SCALES = (1.0, 3.0, 0.01, -1.0)
# Seeds whose cases keep every bound scalar (eps, ...) at the module's live value; the other seeds
# draw each scalar from a range around it, so a kernel that bakes in a constant fails there.
LIVE_SCALAR_SEEDS = (0,)

# Activation-like distributions (see `realistic`): what real residual streams and gates hold and
# N(0, 1) never shows. "offset": every row's mean far from zero relative to its spread
# (catastrophic cancellation of a one-pass variance, exp overflow without a max shift, x*x overflow
# in 16-bit); "outliers": N(0, 1) with a few elements per row near the top of the dtype's safe range
# (sums of squares in 16-bit) and gates past exp's float32 overflow point (e^g / (1 + e^g)).
ACTIVATION_DISTRIBUTIONS = ("offset", "outliers")
ACTIVATION_SEEDS = (0, 1)
# (mean offset, spread) per dtype for "offset": |mean| / spread of 500-2000 where the dtype can still
# express the spread (bfloat16 keeps 8 bits, so its spread must grow with the offset).
OFFSET = {"float16": (500.0, 1.0), "bfloat16": (2000.0, 16.0), "float32": (2000.0, 1.0)}
# Largest outlier per dtype for "outliers": float16 values of several hundred, others in the thousands.
OUTLIER_PEAK = {"float16": 600.0, "bfloat16": 4000.0, "float32": 4000.0}
# Gates (role "gate") reach past exp's float32 overflow point (about 88.7) in both signs.
GATE_PEAK = 200.0

# Shapes past every common cap: more rows than a capped grid covers (1024 programs; 65,535 in a
# CUDA grid's y/z dimension) and more columns than one tile holds (4096, 16384), odd sizes. They run
# once, in the first dtype (caps do not depend on the values; one unwritten element already fails).
# On the CPU the interpreter runs each program in Python (about 5 ms a program), so rows stop just
# past a 1024-program cap there; CUDA goes past the 65,535 of a grid's y/z dimension.
STRESS_SHAPES = {
    "cpu": [[1031, 8], [2, 16411]],
    "cuda": [[70001, 96], [3, 20011]],
}
STRESS_DISTRIBUTIONS = ("normal",)

# Hidden shapes the candidate never sees in advance: non-power-of-two H, one row, many rows, 3-D.
# The CPU set is small because Triton's interpreter runs every program in Python.
HIDDEN_SHAPES = {
    "cpu": [[1, 1000], [3, 64], [67, 96], [2, 3, 64]],
    "cuda": [[1, 96], [3, 1000], [67, 4096], [4099, 3000], [2, 5, 64]],
}
# The plan's classes beyond the seeds x scales grid: what a served model runs and N(0, 1) on fresh
# contiguous tensors never shows (docs/verifier.md, "Plan classes"). Each runs once per case below
# (seed 0, live scalars), so on a GPU they are cheap correctness calls and never timed.
# - wide_rows: non-power-of-two widths between tile sizes, in every dtype (16-bit rows wider than a
#   tile: a tile-size mean, a 16-bit sum of squares, a one-pass variance), with activation-like values.
# - prefill_rows: hundreds to thousands of rows at a width that is no power of two (and, for a GEMM,
#   K not a multiple of 16/32/64).
# - large_tensor: more elements than a persistent loop with a capped trip count covers.
# - rank4: a [b, heads, seq, head_dim] input (Qwen3's q/k norms), never collapsed to 2-D.
# - view: activations as strided slices of a wider buffer (`x.chunk(2, -1)[1]`, `h[:, -1:, :]`).
# - no_optional: optional tensors (a projection's bias) in the state the live module does not show.
# - partial_rotary: rope with a rotary dim below the head dim (Phi-3).
# - zero_rows, masked_rows, late_peak: all-zero rows; rows partly -inf (masked logits, left padding);
#   a late logit that leads the running max of the chunks before it by more than exp's range.
WIDE_SHAPES = {"cpu": [[2, 5120]], "cuda": [[67, 5120], [35, 4608]]}
PREFILL_SHAPES = {"cpu": [[130, 200]], "cuda": [[2053, 1000]]}
LARGE_SHAPES = {"cpu": [[5, 13109]], "cuda": [[257, 4099]]}  # past 2^16 (CPU) and 2^20 (CUDA) elements
RANK4_SHAPES = {"cpu": [[2, 3, 5, 96]], "cuda": [[2, 16, 7, 128]]}
# Where the interpreter affords only a smaller instance of a class (the verdict's `plan_classes`).
FULL_SIZE = {"prefill_rows": 1024, "large_tensor": 2**20}
# Values that belong to logits only (softmax-like families: `logits_input`).
LOGIT_DISTRIBUTIONS = ("masked_rows", "late_peak")
VIEW_LAYOUT = "view"
# The served model's own layouts (the profile target's `layouts`): each activation the server handed
# the op strided or at an offset, drawn with exactly those strides (rows capped as for live shapes).
LIVE_LAYOUT = "live"
# (input index, live shape, strides, storage offset) of one served activation.
LiveLayout = tuple[int, tuple[int, ...], tuple[int, ...], int]
# A live layout's buffer may hold at most this many elements beyond the case's own (h[:, -1:, :] of a
# long prompt strides rows a whole prompt apart): past it the gaps shrink (the class runs reduced).
LIVE_LAYOUT_SLACK = {"cpu": 2**18, "cuda": 2**24}
# Activations a family's modules always pass freshly made (rope's cos and sin, from the rotary
# embedding): left contiguous in view cases.
VIEW_KEEPS_CONTIGUOUS = {"rope": (2, 3)}
DEFAULT_BENCH_SHAPES = [[1, 4096], [2048, 4096]]
DEFAULT_DTYPES = {"cpu": ["float32", "float16"], "cuda": ["float16", "bfloat16", "float32"]}
CPU_MAX_ROWS = 64  # live shapes are capped to this many rows under the interpreter
CUDA_MAX_ELEMENTS = 2**24  # live shapes are capped to this many output elements for correctness on CUDA

TENSOR_KINDS = ("tensor", "optional_tensor")  # ParamSpec kinds a case fills with a tensor (or None)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class Case:
    id: int
    phase: str  # "main" or "recheck" (after the timed runs)
    dtype: str
    shape: tuple[int, ...]
    seed: int
    scale: float
    dist: str = "normal"  # "normal" (N(0, scale^2)) or one of ACTIVATION_DISTRIBUTIONS
    draw_scalars: bool = False  # bound scalars drawn around their live value (else the live value)
    stress: bool = False  # a shape from STRESS_SHAPES
    klass: str = ""  # the plan class of an extra case (see WIDE_SHAPES), "" for the seeds x scales grid
    layout: str = "contiguous"  # "contiguous" or VIEW_LAYOUT (activations as slices of a wider buffer)
    variant: str = ""  # "no_optional" (optional tensors None) or "partial_rotary" (rope), else ""
    # LIVE_LAYOUT cases: (input index, live shape, strides, storage offset) per strided activation.
    live_layout: tuple[LiveLayout, ...] = ()

    def describe(self) -> str:
        inputs = (
            f"inputs x{self.scale:g}" if self.dist == "normal" else DIST_WORDS.get(self.dist, f"inputs {self.dist}")
        )
        extra = ""
        if self.layout == VIEW_LAYOUT:
            extra += " as strided views (each activation a slice of a buffer twice as wide, at an offset)"
        for index, _, stride, offset in self.live_layout:
            extra += f" with input {index} in the served layout (strides {list(stride)}, offset {offset})"
        if self.variant:
            extra += {"no_optional": " with optional tensors None", "partial_rotary": " with partial rotary"}.get(
                self.variant, f" ({self.variant})"
            )
        if self.klass:
            extra += f" [plan class {self.klass}]"
        return f"shape {list(self.shape)} {self.dtype} seed {self.seed} {inputs}{extra}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = list(self.shape)
        data["live_layout"] = [[i, list(shape), list(stride), offset] for i, shape, stride, offset in self.live_layout]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        return cls(
            id=int(data["id"]),
            phase=str(data["phase"]),
            dtype=str(data["dtype"]),
            shape=tuple(int(d) for d in data["shape"]),
            seed=int(data["seed"]),
            scale=float(data["scale"]),
            dist=str(data.get("dist", "normal")),
            draw_scalars=bool(data.get("draw_scalars", False)),
            stress=bool(data.get("stress", False)),
            klass=str(data.get("klass", "")),
            layout=str(data.get("layout", "contiguous")),
            variant=str(data.get("variant", "")),
            live_layout=tuple(
                (int(i), tuple(int(d) for d in shape), tuple(int(d) for d in stride), int(offset))
                for i, shape, stride, offset in data.get("live_layout") or ()
            ),
        )


DIST_WORDS = {
    "offset": "inputs far from zero mean (offset rows)",
    "outliers": "inputs with large outliers",
    "zero_rows": "inputs with all-zero rows",
    "masked_rows": "inputs with rows partly -inf (masked)",
    "late_peak": "inputs with a late element leading the row by more than exp's range",
}


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}") from None


def correctness_shapes(device: str, live: Sequence[Sequence[int]] | None, family: Any = None) -> list[list[int]]:
    """Live shapes first (rows capped on CPU), then the hidden ones, without duplicates. An open
    target draws its unseen shapes along the dims its module accepts changing."""
    target = getattr(family, "open_target", None)
    if target is not None:
        return target.case_shapes(device, live)[0]
    shapes: list[list[int]] = []
    extra = getattr(family, "extra_hidden_shapes", None) or {}
    hidden = [list(s) for s in HIDDEN_SHAPES[device]] + [list(s) for s in extra.get(device, [])]
    for shape in [list(s) for s in live or []] + hidden:
        shape = [int(d) for d in shape]
        if device == "cpu" and len(shape) >= 2 and shape not in hidden:
            shape = cap_rows(shape, CPU_MAX_ROWS)
        if device != "cpu" and shape not in hidden:
            shape = cap_elements(shape, CUDA_MAX_ELEMENTS)
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def cap_rows(shape: list[int], limit: int) -> list[int]:
    """`shape` with its leading dims shrunk, outermost first, until they hold at most `limit` rows;
    the rank stays (a [b, heads, seq, head_dim] q/k norm input stays 4-D: 2-D hid a kernel that
    collapses it wrongly)."""
    out = list(shape)
    for i in range(len(out) - 1):
        rows = 1
        for d in out[:-1]:
            rows *= d
        if rows <= limit:
            break
        others = rows // out[i]
        out[i] = max(1, min(out[i], limit // max(others, 1)))
    return out


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


def stress_shapes(device: str, family: Any = None) -> list[list[int]]:
    """STRESS_SHAPES for `device`, adapted to the family's shape rules (e.g. rope's even head dim)."""
    target = getattr(family, "open_target", None)
    if target is not None:
        return target.case_shapes(device, None)[1]
    shapes = [list(s) for s in STRESS_SHAPES[device]]
    adapt = getattr(family, "adapt_shape", None)
    return [list(adapt(s)) for s in shapes] if adapt is not None else shapes


@dataclass(frozen=True)
class ClassCase:
    """One extra case of a plan class (see WIDE_SHAPES): run once, seed 0, live scalars."""

    klass: str
    dtype: str
    shape: tuple[int, ...]
    dist: str = "normal"
    layout: str = "contiguous"
    variant: str = ""
    live_layout: tuple[LiveLayout, ...] = ()


# Classes an open target does not run: its inputs keep their live ranks.
OPEN_TARGET_SKIPS = ("rank4",)
SIXTEEN_BIT = ("float16", "bfloat16")
STRESS_VALUE_ROWS_CPU = 64  # on the CPU, stress shapes of at most this many rows take activation-like values


def stress_value_shapes(device: str, family: Any) -> list[list[int]]:
    """The stress shapes that take activation-like values in 16-bit: every one on CUDA; on the CPU
    those of few rows (the wide one: the interpreter runs a program per row)."""
    shapes = stress_shapes(device, family)
    if device != "cpu":
        return shapes
    out = []
    for shape in shapes:
        rows = 1
        for d in shape[:-1]:
            rows *= int(d)
        if rows <= STRESS_VALUE_ROWS_CPU:
            out.append(shape)
    return out


def classes_enabled() -> bool:
    """False only where `GPUYANTRA_PLAN_CLASSES=0`: the plan without its classes, to measure what
    they cost (benchmarks/verify_plan_gpu.py); never for a verdict that counts."""
    return os.environ.get("GPUYANTRA_PLAN_CLASSES", "1") != "0"


def class_cases(
    device: str,
    family: Any,
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[str],
    param_specs: Sequence[dict[str, Any]] = (),
    live_params: Mapping[str, Any] | None = None,
    live_layouts: Sequence[Mapping[str, Any]] = (),
) -> list[ClassCase]:
    """The plan classes' cases for `family` on `device`: shapes adapted to the family's rules,
    value classes where the family defines them, the view layout and the optional parameters'
    other state on the first correctness shape (the live one where there is one), and each served
    layout (`live_layouts`, the profile target's `layouts`) in every dtype."""
    out: list[ClassCase] = []
    adapt = getattr(family, "adapt_shape", None)

    def add(
        klass: str,
        dtype: str,
        shape: Sequence[int],
        dist: str = "normal",
        layout: str = "contiguous",
        variant: str = "",
    ) -> None:
        fitted = list(adapt(list(shape))) if adapt is not None else list(shape)
        out.append(ClassCase(klass, dtype, tuple(int(d) for d in fitted), dist, layout, variant))

    logits = bool(getattr(family, "logits_input", False))
    first = dtypes[0]
    target = getattr(family, "open_target", None)
    if target is None:
        for dtype in dtypes:
            for shape in WIDE_SHAPES[device]:
                for dist in _wide_distributions(device, dtype, dtype == first, logits):
                    add("wide_rows", dtype, shape, dist)
            for shape in RANK4_SHAPES[device]:
                add("rank4", dtype, shape)
        for shape in PREFILL_SHAPES[device]:
            add("prefill_rows", first, shape)
        for shape in LARGE_SHAPES[device]:
            add("large_tensor", first, shape)
    else:  # the same classes along the dims the module lets change (`OpenTarget.class_keys`)
        keys = target.class_keys(device)
        for dtype in dtypes if "wide_rows" in keys else ():
            for dist in _wide_distributions(device, dtype, dtype == first, logits):
                add("wide_rows", dtype, keys["wide_rows"], dist)
        for klass in ("prefill_rows", "large_tensor"):
            if klass in keys:
                add(klass, first, keys[klass])
    # Activation-like values in each 16-bit dtype on the stress shapes (16-bit sums of squares and
    # exp overflow past a tile); on the CPU only those of few rows (each row a program of the
    # interpreter) and only the outliers (offset rows in 16-bit run in the wide class there).
    for dtype in [d for d in dtypes if d in SIXTEEN_BIT]:
        for shape in stress_value_shapes(device, family):
            for dist in ACTIVATION_DISTRIBUTIONS if device != "cpu" else ("outliers",):
                add("stress_values", dtype, shape, dist)
    base = _first_multi_row(shapes)
    optional = [
        s["name"]
        for s in param_specs
        if s.get("kind") == "optional_tensor" and s.get("shape") is not None and s["name"] not in (live_params or {})
    ]
    for dtype in dtypes:
        add("view", dtype, base, layout=VIEW_LAYOUT)
        if getattr(family, "open_target", None) is not None:
            add("zero_rows", dtype, base, "zero_rows")
        if optional:  # the live state is unknown: the other state too (most LLM projections have no bias)
            add("no_optional", dtype, base, variant="no_optional")
        if getattr(family, "name", "") == "rope":  # Phi-3's partial rotary beside the full one
            add("partial_rotary", dtype, base, variant="partial_rotary")
    for served_shape, layouts in live_layout_cases(device, live_layouts):
        for dtype in dtypes:
            out.append(ClassCase("live_layout", dtype, served_shape, layout=LIVE_LAYOUT, live_layout=layouts))
    return out


def live_layout_cases(
    device: str, live_layouts: Sequence[Mapping[str, Any]]
) -> list[tuple[tuple[int, ...], tuple[LiveLayout, ...]]]:
    """(case shape, layouts) per served shape of input 0 that came strided or at an offset: the
    shape's rows capped as for live shapes, every input's layout of that call kept together. A
    layout of a later input alone (rope's k) runs at input 0's shape where the shapes agree."""
    grouped: dict[tuple[int, ...], list[LiveLayout]] = {}
    for layout in live_layouts:
        entry = (
            int(layout["input"]),
            tuple(int(d) for d in layout["shape"]),
            tuple(int(d) for d in layout["stride"]),
            int(layout["offset"]),
        )
        grouped.setdefault(entry[1], [])
        if entry not in grouped[entry[1]]:
            grouped[entry[1]].append(entry)
    out = []
    for shape, layouts in grouped.items():
        capped = (
            cap_rows(list(shape), CPU_MAX_ROWS) if device == "cpu" else cap_elements(list(shape), CUDA_MAX_ELEMENTS)
        )
        out.append((tuple(capped), tuple(sorted(layouts))))
    return out


def check_live_layouts(layouts: Any) -> list[dict[str, Any]]:
    """The profile target's `layouts` checked: a list of {"input", "shape", "stride", "offset"} with
    non-negative integers, as many strides as dims. Raises ValueError naming the bad field."""
    if not isinstance(layouts, (list, tuple)):
        raise ValueError(f"layouts must be a list of {{input, shape, stride, offset}}, got {layouts!r}")
    out = []
    for n, layout in enumerate(layouts):
        where = f"layouts[{n}]"
        if not isinstance(layout, Mapping) or set(layout) < {"input", "shape", "stride", "offset"}:
            raise ValueError(f"{where} must hold input, shape, stride and offset, got {layout!r}")
        shape, stride = layout["shape"], layout["stride"]
        if not isinstance(shape, (list, tuple)) or not shape or any(not isinstance(d, int) or d < 1 for d in shape):
            raise ValueError(f"{where}.shape must be a list of positive sizes, got {shape!r}")
        if not isinstance(stride, (list, tuple)) or len(stride) != len(shape):
            raise ValueError(f"{where}.stride must give one stride per dim of {list(shape)}, got {stride!r}")
        if any(not isinstance(d, int) or d < 0 for d in stride):
            raise ValueError(f"{where}.stride must hold non-negative integers, got {stride!r}")
        for key in ("input", "offset"):
            if not isinstance(layout[key], int) or layout[key] < 0:
                raise ValueError(f"{where}.{key} must be a non-negative integer, got {layout[key]!r}")
        out.append({k: layout[k] for k in ("input", "shape", "stride", "offset")})
    return out


def _wide_distributions(device: str, dtype: str, first: bool, logits: bool) -> tuple[str, ...]:
    """The inputs of the wide-row class in `dtype`, N(0, 1) first (a failure there names the
    shape; the others then name it too). On the CPU (each wide call is seconds of interpreter) the
    value classes run in the first dtype only."""
    values = ("zero_rows", *(LOGIT_DISTRIBUTIONS if logits else ()))
    if device != "cpu" or first:
        return ("normal", *ACTIVATION_DISTRIBUTIONS, *values)
    return ("normal", *ACTIVATION_DISTRIBUTIONS)


def _first_multi_row(shapes: Sequence[Sequence[int]]) -> list[int]:
    """The first shape (the live one where there is one) with two rows or more: a view of one row
    has no row stride to get wrong."""
    for shape in shapes:
        rows = 1
        for d in shape[:-1]:
            rows *= int(d)
        if rows >= 2:
            return [int(d) for d in shape]
    return [3, int(shapes[0][-1])] if shapes else [3, 64]


def plan_classes(device: str, cases: Sequence[Case], family: Any = None) -> dict[str, str]:
    """Per plan class: "full" (at the size a served model runs), "reduced" (a smaller instance: the
    interpreter's budget, or a 16-bit dtype it cannot run), or why it did not run."""
    out: dict[str, str] = {}
    for case in cases:
        if not case.klass:
            continue
        size = 1
        for d in case.shape:
            size *= d
        rows = size // max(case.shape[-1], 1)
        open_target = getattr(family, "open_target", None) is not None
        reduced = (
            (open_target and device == "cpu" and case.klass in ("wide_rows", "prefill_rows", "large_tensor"))
            or (case.klass == "stress_values" and device == "cpu")  # the few-row stress shapes only
            or (not open_target and case.klass == "prefill_rows" and rows < FULL_SIZE["prefill_rows"])
            or (not open_target and case.klass == "large_tensor" and size < FULL_SIZE["large_tensor"])
            or (case.klass == "wide_rows" and device == "cpu")  # 2 rows, and no bfloat16 under the interpreter
            or (case.klass == "live_layout" and not _served_as_is(case, device))
        )
        if out.get(case.klass) != "reduced":
            out[case.klass] = "reduced" if reduced else "full"
    if getattr(family, "open_target", None) is not None:
        for klass in OPEN_TARGET_SKIPS:
            out.setdefault(klass, "not applicable (an open target's inputs keep their live ranks)")
        for klass in ("wide_rows", "prefill_rows", "large_tensor"):
            out.setdefault(klass, "not run (the module fixes the dims it would change)")
    return out


def _served_as_is(case: Case, device: str) -> bool:
    """Whether a live-layout case runs the served shape with the served strides (else rows capped or
    gaps shrunk: `fit_layout`)."""
    for _, shape, stride, offset in case.live_layout:
        if shape != case.shape:
            return False
        if fit_layout(shape, stride, offset, LIVE_LAYOUT_SLACK[device]) != (stride, offset):
            return False
    return True


def plan(
    device: str,
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[str],
    seeds: Sequence[int] = SEEDS,
    recheck: bool = False,
    stress: Sequence[Sequence[int]] = (),
    extras: Sequence[ClassCase] = (),
) -> list[Case]:
    """Every case, grouped by (phase, dtype, shape) so outputs of one group stay alive together.

    Per (dtype, shape): every seed x SCALES of N(0, 1) (bound scalars drawn, except on
    LIVE_SCALAR_SEEDS), then the activation-like distributions on ACTIVATION_SEEDS with live scalars
    (so a failure there names the inputs, not the constants). `stress` shapes run N(0, 1) once,
    in the first dtype. `extras` (`class_cases`) follow the main grid, once each."""
    cases: list[Case] = []

    def add(
        phase: str,
        dtype: str,
        shape: Sequence[int],
        seed: int,
        scale: float,
        dist: str = "normal",
        draw: bool = False,
        is_stress: bool = False,
    ) -> None:
        cases.append(Case(len(cases), phase, dtype, tuple(shape), seed, scale, dist, draw, is_stress))

    for dtype in dtypes:
        for shape in shapes:
            for seed in seeds:
                for scale in SCALES:
                    add("main", dtype, shape, seed, scale, draw=seed not in LIVE_SCALAR_SEEDS)
            for seed in [s for s in seeds if s in ACTIVATION_SEEDS] or list(seeds[:1]):
                for dist in ACTIVATION_DISTRIBUTIONS:
                    add("main", dtype, shape, seed, 1.0, dist)
        for shape in stress if dtype == dtypes[0] else ():
            for dist in STRESS_DISTRIBUTIONS:
                add("main", dtype, shape, seeds[0], 1.0, dist, is_stress=True)
    for extra in extras:
        cases.append(
            Case(
                len(cases),
                "main",
                extra.dtype,
                tuple(extra.shape),
                seeds[0],
                1.0,
                extra.dist,
                klass=extra.klass,
                layout=extra.layout,
                variant=extra.variant,
                live_layout=extra.live_layout,
            )
        )
    if recheck:
        for shape in shapes:
            for seed in RECHECK_SEEDS:
                for scale in SCALES:
                    add("recheck", dtypes[0], shape, seed, scale, draw=True)
                for dist in ACTIVATION_DISTRIBUTIONS:
                    add("recheck", dtypes[0], shape, seed, 1.0, dist)
    return cases


def _generator(case: Case, device: str | torch.device = "cpu") -> torch.Generator:
    key = f"{case.seed}|{list(case.shape)}|{case.dtype}|{case.scale!r}".encode()
    where = "cuda" if str(device).startswith("cuda") else "cpu"
    return torch.Generator(device=where).manual_seed(zlib.crc32(key) + 7919 * case.seed)


def make_case(
    family: Any,
    case: Case,
    param_specs: Sequence[dict[str, Any]],
    device: str | torch.device = "cpu",
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """(activations, params) for one case: random inputs, freshly randomized parameters."""
    dtype = dtype_of(case.dtype)
    rows, hidden = tuple(case.shape[:-1]), int(case.shape[-1])
    generator = _generator(case, device)
    activations = tuple(family.make_activations(rows, hidden, dtype, generator.device, generator, case.scale))
    if case.variant == "partial_rotary":
        activations = partial_rotary(activations)
    if case.dist != "normal":
        roles = activation_roles(family, len(activations))
        for tensor, role in zip(activations, roles):
            realistic(tensor, role, case.dist, case.dtype, generator)
    params: dict[str, Any] = {}
    tensor_shapes = param_case_shapes(family, case.shape, param_specs, device)
    for spec in param_specs:
        if spec["kind"] in TENSOR_KINDS:
            shape = tensor_shapes[spec["name"]]
            # An optional tensor the live module holds as None (a Linear without bias), or its other state.
            if shape is None or (case.variant == "no_optional" and spec["kind"] == "optional_tensor"):
                params[spec["name"]] = None
                continue
            # Never weight = 1, bias = 0: random values around 0.3 with both signs.
            values = torch.randn(shape, generator=generator, dtype=torch.float32, device=generator.device) * 0.5 + 0.3
            if spec.get("positive"):  # running variances, scales: their live values are never negative
                values = values.abs() + 0.05
            params[spec["name"]] = values.to(dtype)
        elif case.draw_scalars:
            # One drawn value per (seed, parameter), not per case: a kernel that takes eps as a
            # tl.constexpr compiles once per value, and a handful of values already exposes a constant.
            scalar_gen = torch.Generator().manual_seed(zlib.crc32(f"{case.seed}|{spec['name']}".encode()))
            params[spec["name"]] = draw_scalar(spec["value"], scalar_gen)
        else:
            params[spec["name"]] = spec["value"]
    if str(device) != str(generator.device):
        activations = tuple(a.to(device) for a in activations)
        params = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
    if case.layout == VIEW_LAYOUT:
        kept = VIEW_KEEPS_CONTIGUOUS.get(getattr(family, "name", ""), ())
        activations = tuple(a if i in kept else strided_view(a) for i, a in enumerate(activations))
    if case.layout == LIVE_LAYOUT:
        device_type = "cuda" if str(device).startswith("cuda") else "cpu"
        layouts = {index: (stride, offset) for index, _, stride, offset in case.live_layout}
        activations = tuple(
            live_view(a, *fit_layout(list(a.shape), *layouts[i], LIVE_LAYOUT_SLACK[device_type])) if i in layouts else a
            for i, a in enumerate(activations)
        )
    return activations, params


def fit_layout(shape: Sequence[int], stride: Sequence[int], offset: int, slack: int) -> tuple[tuple[int, ...], int]:
    """(strides, offset) of a served layout for a case of `shape` (rows capped: strides stay valid as
    dims shrink), the gaps between dims shrunk where the buffer would exceed the case's elements by
    more than `slack`: each dim then lies just past the ones inside it in memory, plus a gap of the
    same size modulo 64 (so the kernel still meets a row stride that is not the row's width), and
    the offset keeps its value modulo 64."""
    stride, size = tuple(int(s) for s in stride), 1
    for d in shape:
        size *= int(d)
    if _buffer_elements(shape, stride, offset) <= size + slack:
        return stride, int(offset)
    fitted = list(stride)
    span = 1  # elements the dims inside this one cover
    for d in sorted(range(len(shape)), key=lambda i: (stride[i], i)):
        gap = max(stride[d] - span, 0)
        fitted[d] = span + (gap % 64 if gap else 0) + (64 if gap >= 64 else 0)
        span = fitted[d] * (int(shape[d]) - 1) + span
    return tuple(fitted), int(offset) % 64


def _buffer_elements(shape: Sequence[int], stride: Sequence[int], offset: int) -> int:
    return int(offset) + sum((int(n) - 1) * int(s) for n, s in zip(shape, stride)) + 1


def live_view(t: torch.Tensor, stride: Sequence[int], offset: int) -> torch.Tensor:
    """`t`'s values in a NaN-filled buffer at `stride` and `offset` (a served layout): a kernel that
    assumes contiguous rows or no offset reads NaN. `t` as it is where the strides do not fit it."""
    if not t.is_floating_point() or len(stride) != t.dim() or t.numel() == 0:
        return t
    buffer = torch.full((_buffer_elements(t.shape, stride, offset),), float("nan"), dtype=t.dtype, device=t.device)
    view = buffer.as_strided(tuple(t.shape), tuple(int(s) for s in stride), int(offset))
    if _overlaps(view):
        return t
    view.copy_(t)
    return view


def _overlaps(view: torch.Tensor) -> bool:
    """Whether two elements of `view` share memory (strides from another shape can collide)."""
    dims = sorted((int(s), int(n)) for s, n in zip(view.stride(), view.shape) if n > 1)
    span = 1
    for stride, size in dims:
        if stride < span:
            return True
        span = stride * (size - 1) + span
    return False


def strided_view(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values as the second half of a buffer twice as wide in the last dim, its other dims
    laid out as in `t` (rope's transposed q stays transposed): rows strided 2H apart at an offset of
    H, as `x.chunk(2, -1)[1]` gives. The first half is NaN, so a kernel that assumes a row stride of
    H or no offset reads it."""
    if not t.is_floating_point() or t.dim() == 0:
        return t
    last = t.dim() - 1
    order = [*sorted(range(last), key=lambda d: -int(t.stride()[d])), last]  # outermost to innermost in memory
    physical = [int(t.shape[d]) for d in order]
    width = physical[-1]
    physical[-1] = 2 * width
    buffer = torch.full(physical, float("nan"), dtype=t.dtype, device=t.device)
    view = buffer.permute([order.index(d) for d in range(t.dim())])[..., width:]
    view.copy_(t)
    return view


def partial_rotary(activations: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """rope's (q, k, cos, sin) with cos and sin cut to a rotary dim of half the head dim (even),
    as Phi-3's partial rotary passes them."""
    q, k, cos, sin = activations
    rotary = max(2, (int(cos.shape[-1]) // 2) // 2 * 2)
    return q, k, cos[..., :rotary].contiguous(), sin[..., :rotary].contiguous()


def param_case_shapes(
    family: Any, shape: Sequence[int], param_specs: Sequence[dict[str, Any]], device: str | torch.device = "cpu"
) -> dict[str, list[int] | None]:
    """Each tensor parameter's shape at activation `shape` ("H" is its last dim; None stays None),
    fitted by the family where a live shape would be too big for one case on `device`."""
    hidden = int(shape[-1])
    shapes = {
        spec["name"]: None if spec["shape"] is None else [hidden if d == "H" else int(d) for d in spec["shape"]]
        for spec in param_specs
        if spec["kind"] in TENSOR_KINDS
    }
    fit = getattr(family, "fit_params", None)
    if fit is None or not shapes:
        return shapes
    return fit(list(shape), shapes, "cuda" if str(device).startswith("cuda") else "cpu")


def live_param_specs(
    specs: Sequence[dict[str, Any]],
    param_shapes: Mapping[str, Sequence[int] | None] | None,
    live: Sequence[Sequence[int]] = (),
) -> list[dict[str, Any]]:
    """The contract's parameter specs with the live module's tensor shapes (`verify --param-shape
    weight=2048x1536`): cases then build weights of the real out-features. A dim becomes the
    case's "H" where the contract had "H" and the live dim is the live hidden size (the live
    activations' last dim, else the last dim of the first shape given); `None` marks an optional
    tensor the module holds as None. Raises ValueError for a parameter the family does not have."""
    if not param_shapes:
        return [dict(s) for s in specs]
    by_name = {s["name"]: s for s in specs}
    for name, shape in param_shapes.items():
        spec = by_name.get(name)
        if spec is None or spec["kind"] not in TENSOR_KINDS:
            tensors = [s["name"] for s in specs if s["kind"] in TENSOR_KINDS]
            raise ValueError(f"--param-shape {name}: not a tensor parameter of this op (its tensors: {tensors})")
        if shape is None and spec["kind"] != "optional_tensor":
            raise ValueError(f"--param-shape {name}=none: {name} cannot be None for this op")
    given = [list(v) for v in param_shapes.values() if v]
    hidden = int(live[0][-1]) if live else (int(given[0][-1]) if given else None)
    out = []
    for spec in specs:
        spec = dict(spec)
        if spec["name"] in param_shapes:
            shape = param_shapes[spec["name"]]
            old = list(spec.get("shape") or [])
            spec["shape"] = (
                None
                if shape is None
                else [
                    "H" if i < len(old) and old[i] == "H" and int(d) == hidden else int(d) for i, d in enumerate(shape)
                ]
            )
        out.append(spec)
    return out


def parse_param_shapes(values: Sequence[str]) -> dict[str, list[int] | None]:
    """`["weight=2048x1536", "bias=none"]` -> {"weight": [2048, 1536], "bias": None} (CLI syntax)."""
    out: dict[str, list[int] | None] = {}
    for text in values:
        name, sep, dims = text.partition("=")
        name, dims = name.strip(), dims.strip().lower()
        try:
            if not sep or not name:
                raise ValueError
            out[name] = None if dims == "none" else [int(d) for d in dims.split("x")]
        except ValueError:
            raise ValueError(f"--param-shape {text!r}: expected NAME=AxB (weight=2048x1536) or NAME=none") from None
        if out[name] is not None and any(d < 1 for d in out[name] or []):
            raise ValueError(f"--param-shape {text!r}: sizes must be positive")
    return out


def float64_reference(family: Any, activations: Sequence[torch.Tensor], params: dict[str, Any]) -> list[torch.Tensor]:
    """The family's reference on float64 copies of exactly these inputs (on their device), as a list."""
    # Integer inputs (class ids, indices) stay integers; only floating values widen.
    acts = [a.detach().to(torch.float64) if a.is_floating_point() else a.detach() for a in activations]
    kw = {
        k: v.detach().to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in params.items()
    }
    with torch.no_grad():
        out = family.reference(*acts, **kw)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def float32_reference(
    family: Any,
    activations: Sequence[torch.Tensor],
    params: dict[str, Any],
) -> list[torch.Tensor] | None:
    """The family's reference computed in float32 on exactly these inputs (16-bit inputs widen
    exactly): the error any honest float32 computation makes on them, without the output's own
    rounding. Products are IEEE float32 (TF32 off for matmuls and convolutions, whatever the
    process set): the judge's allowance grows with this error, and a TF32 reference would let
    a TF32 kernel through. None where the device lacks a kernel for it."""

    def widen(t: Any) -> Any:
        return t.to(torch.float32) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    return native_reference(family, [widen(a) for a in activations], {k: widen(v) for k, v in params.items()})


def native_reference(
    family: Any,
    activations: Sequence[torch.Tensor],
    params: dict[str, Any],
) -> list[torch.Tensor] | None:
    """The family's reference on exactly these inputs in their own dtypes: what eager computes,
    rounding after each op. None where the device lacks a kernel for it."""
    try:
        with torch.no_grad(), ieee_float32():
            out = family.reference(*activations, **params)
    except Exception:  # noqa: BLE001 - no kernel for this dtype: no slack from it
        return None
    return list(out) if isinstance(out, (tuple, list)) else [out]


_IEEE_LOCK = threading.Lock()
_ieee_users: list[tuple[bool, bool]] = []  # the settings before the first of the contexts now open


@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """float32 matmuls and convolutions in IEEE float32 (no TF32) inside; the process's settings
    come back when the last such context open (on any thread: judging runs beside the sandbox) ends."""
    with _IEEE_LOCK:
        if not _ieee_users:
            _ieee_users.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        else:
            _ieee_users.append(_ieee_users[0])
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        with _IEEE_LOCK:
            before = _ieee_users.pop()
            if not _ieee_users:
                torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def expected_outputs(
    family: Any,
    activations: Sequence[torch.Tensor],
    params: dict[str, Any],
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


def activation_roles(family: Any, n: int) -> tuple[str, ...]:
    """Each activation's role: "stream" (residual-stream-like), "gate" (feeds exp) or "bounded"
    (left as the family makes it, e.g. rope's cos/sin). Families say so in `activation_roles`."""
    roles = tuple(getattr(family, "activation_roles", ()) or ())
    return (roles + ("stream",) * n)[:n]


def realistic(tensor: torch.Tensor, role: str, dist: str, dtype: str, generator: torch.Generator) -> None:
    """Reshape (in place, keeping the layout) an N(0, 1)-like activation into distribution `dist`."""
    if role == "bounded" or tensor.numel() == 0 or not tensor.is_floating_point():
        return
    where = generator.device
    base = tensor.to(device=where, dtype=torch.float32)
    row_shape = (*tensor.shape[:-1], 1) if tensor.dim() else ()
    if dist in ("zero_rows", "masked_rows", "late_peak"):
        values = _value_class(base, dist, row_shape, generator)
    elif dist == "offset":
        offset, spread = OFFSET.get(dtype, OFFSET["float32"])
        if role == "gate":
            offset, spread = GATE_PEAK, 2.0
        sign = torch.randint(0, 2, row_shape, generator=generator, device=where).to(torch.float32) * 2 - 1
        mean = sign * offset * (0.5 + 0.5 * torch.rand(row_shape, generator=generator, device=where))
        values = base * spread + mean
    elif dist == "outliers":
        peak = GATE_PEAK if role == "gate" else OUTLIER_PEAK.get(dtype, OUTLIER_PEAK["float32"])
        floor = 90.0 if role == "gate" else 0.25 * peak
        width = int(tensor.shape[-1]) if tensor.dim() else 1
        # At least two outliers per row on average, about 1% of a wide row.
        chance = max(0.01, 2.0 / max(width, 1))
        hit = torch.rand(tensor.shape, generator=generator, device=where) < chance
        sign = torch.randint(0, 2, tensor.shape, generator=generator, device=where).to(torch.float32) * 2 - 1
        size = floor + (peak - floor) * torch.rand(tensor.shape, generator=generator, device=where)
        values = torch.where(hit, sign * size, base)
    else:
        raise ValueError(f"unknown input distribution {dist!r}")
    tensor.copy_(values.to(tensor.dtype))


def _value_class(base: torch.Tensor, dist: str, row_shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """`base` (N(0, 1)-like, float32) with the rows of a value class: every other row zero
    (`zero_rows`); rows partly -inf, a random prefix (left padding) in even rows and about half the
    elements in odd ones, the last element finite, and every fourth row (of four or more) -inf
    whole (`masked_rows`: a fully masked row has no softmax; the module gives NaN there and so
    must the kernel, judged against the float64 reference's NaN positions); the last element of
    each row 100 above the row's max (`late_peak`: exp(100) overflows float32, so a max taken over
    the first chunks only fails)."""
    where = generator.device
    if base.dim() == 0:
        return base
    width = int(base.shape[-1])
    row_index = torch.arange(base.numel() // max(width, 1), device=where).reshape(row_shape)
    if dist == "zero_rows":
        return torch.where(row_index % 2 == 0, torch.zeros_like(base), base)
    cols = torch.arange(width, device=where)
    if dist == "masked_rows":
        prefix = (torch.rand(row_shape, generator=generator, device=where) * 0.9 * width).long()
        scattered = torch.rand(base.shape, generator=generator, device=where) < 0.5
        masked = torch.where(row_index % 2 == 0, cols < prefix, scattered) & (cols < width - 1)
        masked |= row_index % 4 == 3  # a row masked whole
        return base.masked_fill(masked, float("-inf"))
    peak = base.amax(dim=-1, keepdim=True) + 100.0
    return torch.where(cols == width - 1, peak, base)


def draw_scalar(live: Any, generator: torch.Generator) -> Any:
    """A bound scalar drawn around its live value: eps-like values (|v| < 0.01) log-uniformly from
    live/10 to live*100 (they matter where rows are small: the x0.01 inputs), others from x0.5 to x2.
    Booleans, integers and non-numbers stay live (they select behaviour, not a value)."""
    if isinstance(live, bool) or not isinstance(live, float):
        return live
    u = float(torch.rand((), generator=generator, device=generator.device))
    if live == 0.0:
        return 10.0 ** (-6 + 4 * u)
    if abs(live) < 0.01:
        return live * 10.0 ** (-1 + 3 * u)
    return live * 2.0 ** (-1 + 2 * u)
