"""Bottleneck fingerprints: index a kernel by the physics of why its op is slow, not by its name.

A fingerprint is a deterministic numeric vector (no remote embedding model) built from:

* the op's *class* of computation (norm, gated activation, rope, softmax, attention, matmul, ...)
  and whether it reduces along the hidden dimension: a GPT-2 LayerNorm and a Qwen RMSNorm are both
  "norm, row reduction";
* the regime the profiler measured (memory-, compute- or launch-bound);
* log arithmetic intensity, log hidden size, log rows;
* the dtype (one-hot and element size);
* the hardware class (GPU or not, plus a stable hashed bucket);
* a small hashed component of the op name, so the same family ranks above a sibling family.

Weights put the class and regime first, then intensity and sizes, so nearest-neighbour retrieval
across families finds kernels with the same bottleneck shape. Everything is computed with
`hashlib`, never Python's salted `hash`, so vectors are identical across processes and machines.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

FINGERPRINT_VERSION = 1
FINGERPRINT_DIM = 32

OP_CLASSES = ("norm", "activation", "rope", "softmax", "attention", "matmul", "elementwise", "other")
REGIMES = ("memory-bound", "compute-bound", "launch-bound")
DTYPES = ("float32", "bfloat16", "float16")
_ELEMENT_BYTES = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

# Families known by name; anything else is classified by the words in its name.
_KNOWN_CLASSES = {
    "rms_norm": "norm",
    "layer_norm": "norm",
    "add_rms_norm": "norm",
    "gemma_rms_norm": "norm",
    "group_norm": "norm",
    "batch_norm": "norm",
    "silu_mul": "activation",
    "gelu_tanh_mul": "activation",
    "gelu_mul": "activation",
    "swiglu": "activation",
    "geglu": "activation",
    "gelu": "activation",
    "silu": "activation",
    "relu": "activation",
    "rope": "rope",
    "rotary": "rope",
    "softmax": "softmax",
    "log_softmax": "softmax",
    "attention": "attention",
    "sdpa": "attention",
    "matmul": "matmul",
    "linear": "matmul",
    "gemm": "matmul",
}
# Arithmetic intensity (FLOP/byte) to assume when a target carries neither AI nor shapes.
_DEFAULT_AI = {
    "norm": 0.6,
    "activation": 0.4,
    "rope": 0.5,
    "softmax": 0.8,
    "attention": 20.0,
    "matmul": 100.0,
    "elementwise": 0.2,
    "other": 1.0,
}
_ROW_REDUCTION = {"norm", "softmax", "attention", "matmul"}

# Weights of each block of the vector (before L2 normalization).
W_CLASS, W_REGIME, W_REDUCTION, W_AI, W_HIDDEN, W_ROWS = 1.0, 0.8, 0.5, 1.0, 0.5, 0.25
W_DTYPE, W_BYTES, W_GPU, W_HW, W_OP = 0.4, 0.25, 0.5, 0.5, 0.3
_HW_BUCKETS, _OP_BUCKETS = 6, 5


def op_class(op: str) -> str:
    op = op.lower()
    if op in _KNOWN_CLASSES:
        return _KNOWN_CLASSES[op]
    if "norm" in op:
        return "norm"
    if "rope" in op or "rotary" in op:
        return "rope"
    if "softmax" in op:
        return "softmax"
    if "attn" in op or "attention" in op:
        return "attention"
    if any(w in op for w in ("gelu", "silu", "swish", "relu", "glu")):
        return "activation"
    if any(w in op for w in ("matmul", "gemm", "linear", "mm")):
        return "matmul"
    if any(w in op for w in ("add", "mul", "scale", "cast")):
        return "elementwise"
    return "other"


def normalize_dtype(dtype: Any) -> str:
    text = str(dtype or "float32").replace("torch.", "").lower()
    return {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(
        text, text
    )


def _bucket(text: str, buckets: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") % buckets


def _estimate_ai(op: str, shape: list[int] | None, dtype: str, klass: str) -> float:
    if shape:
        try:
            import torch

            from gpuyantra.ops import get_op

            family = get_op(op)
            nbytes = family.bytes_moved(shape, getattr(torch, dtype, torch.float32))
            flops = family.flops(shape)
            if nbytes > 0:
                return float(flops) / float(nbytes)
        except Exception:  # noqa: BLE001 - unknown family or no roofline model: use the class default
            pass
    return _DEFAULT_AI[klass]


@dataclass(frozen=True)
class Fingerprint:
    op: str
    op_class: str
    regime: str
    arithmetic_intensity: float
    hidden: int
    rows: int
    dtype: str
    hardware: str
    version: int = FINGERPRINT_VERSION

    @classmethod
    def from_target(cls, target: Mapping[str, Any], hardware: str) -> Fingerprint:
        """From a profile target dict (op, regime, shapes, dtype, arithmetic_intensity optional)."""
        op = str(target["op"])
        klass = op_class(op)
        dtype = normalize_dtype(target.get("dtype") or (target.get("dtypes") or [None])[0])
        shapes = target.get("shapes") or []
        shape = [int(d) for d in shapes[0]] if shapes and shapes[0] else None
        hidden = int(shape[-1]) if shape else int(target.get("hidden") or 0)
        rows = int(math.prod(shape[:-1])) if shape and len(shape) > 1 else int(target.get("rows") or 1)
        ai = target.get("arithmetic_intensity")
        if ai is None:
            ai = _estimate_ai(op, shape, dtype, klass)
        regime = str(target.get("regime") or ("memory-bound" if float(ai) < 10 else "compute-bound"))
        return cls(
            op=op,
            op_class=klass,
            regime=regime,
            arithmetic_intensity=float(ai),
            hidden=hidden,
            rows=max(rows, 1),
            dtype=dtype,
            hardware=str(hardware),
        )

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Fingerprint:
        return cls(
            op=str(payload["op"]),
            op_class=str(payload.get("op_class") or op_class(str(payload["op"]))),
            regime=str(payload.get("regime") or "memory-bound"),
            arithmetic_intensity=float(payload.get("arithmetic_intensity") or 0.0),
            hidden=int(payload.get("hidden") or 0),
            rows=int(payload.get("rows") or 1),
            dtype=normalize_dtype(payload.get("dtype")),
            hardware=str(payload.get("hardware") or "cpu"),
        )

    def to_payload(self) -> dict[str, Any]:
        out = asdict(self)
        out["version"] = FINGERPRINT_VERSION
        out["log_ai"] = round(math.log2(1.0 + max(self.arithmetic_intensity, 0.0)), 6)
        return out

    @property
    def vector(self) -> list[float]:
        v = [0.0] * FINGERPRINT_DIM
        klass = self.op_class if self.op_class in OP_CLASSES else "other"
        v[OP_CLASSES.index(klass)] = W_CLASS  # 0..7
        if self.regime in REGIMES:
            v[8 + REGIMES.index(self.regime)] = W_REGIME  # 8..10
        v[11] = W_REDUCTION if klass in _ROW_REDUCTION else 0.0
        v[12] = W_AI * math.log2(1.0 + max(self.arithmetic_intensity, 0.0)) / 4.0
        v[13] = W_HIDDEN * math.log2(max(self.hidden, 1)) / 16.0
        v[14] = W_ROWS * math.log2(max(self.rows, 1)) / 16.0
        dtype = self.dtype if self.dtype in DTYPES else None
        if dtype is not None:
            v[15 + DTYPES.index(dtype)] = W_DTYPE  # 15..17
        else:
            v[18] = W_DTYPE
        v[19] = W_BYTES * _ELEMENT_BYTES.get(self.dtype, 4) / 4.0
        v[20] = W_GPU if self.hardware != "cpu" else 0.0
        v[21 + _bucket("hw:" + self.hardware, _HW_BUCKETS)] = W_HW  # 21..26
        v[27 + _bucket("op:" + self.op, _OP_BUCKETS)] = W_OP  # 27..31
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]

    def similarity(self, other: Fingerprint) -> float:
        return sum(a * b for a, b in zip(self.vector, other.vector))

    def describe(self) -> str:
        return (
            f"{self.op_class}/{self.regime} AI={self.arithmetic_intensity:.2f} H={self.hidden} rows={self.rows} "
            f"{self.dtype} on {self.hardware}"
        )
