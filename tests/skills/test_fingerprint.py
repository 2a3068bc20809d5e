"""Bottleneck fingerprints: deterministic, fixed-size, and near for ops with the same physics."""

from __future__ import annotations

import math

from gpuyantra.skills import FINGERPRINT_DIM, Fingerprint, op_class
from tests.skills.conftest import run_python


def target(op, shape, regime="launch-bound", dtype="bfloat16", **extra):
    return {"op": op, "regime": regime, "shapes": [list(shape)], "dtype": dtype, **extra}


def test_vector_is_fixed_size_unit_and_deterministic_across_processes():
    fp = Fingerprint.from_target(target("rms_norm", (1, 1, 1536)), "nvidia-h200")
    assert len(fp.vector) == FINGERPRINT_DIM
    assert math.isclose(sum(x * x for x in fp.vector), 1.0, rel_tol=1e-9)
    code = (
        "from gpuyantra.skills import Fingerprint; "
        "print(Fingerprint.from_target({'op': 'rms_norm', 'regime': 'launch-bound', 'shapes': [[1, 1, 1536]], "
        "'dtype': 'bfloat16'}, 'nvidia-h200').vector)"
    )
    other = run_python(code, env_extra={"PYTHONHASHSEED": "123"}).stdout.strip()
    assert other == str(fp.vector)


def test_fields_from_a_profile_target():
    fp = Fingerprint.from_target(
        target("rms_norm", (4, 512, 1536), regime="memory-bound", dtype="torch.float16", arithmetic_intensity=0.9),
        "nvidia-h200",
    )
    assert (fp.op, fp.op_class, fp.regime, fp.hidden, fp.rows, fp.dtype) == (
        "rms_norm",
        "norm",
        "memory-bound",
        1536,
        2048,
        "float16",
    )
    assert fp.arithmetic_intensity == 0.9
    payload = fp.to_payload()
    assert payload["hardware"] == "nvidia-h200" and payload["version"] == 1 and payload["log_ai"] > 0
    assert Fingerprint.from_payload(payload) == fp
    # Without an arithmetic intensity it comes from the op family's roofline model on the shape.
    derived = Fingerprint.from_target(target("rms_norm", (1, 1, 1536)), "cpu")
    assert 0.3 < derived.arithmetic_intensity < 2.0
    # An op the registry does not know still gets a fingerprint.
    assert Fingerprint.from_target({"op": "fancy_group_norm"}, "cpu").op_class == "norm"


def test_op_classes():
    assert {op_class(o) for o in ("rms_norm", "layer_norm", "gemma_rms_norm", "add_rms_norm")} == {"norm"}
    assert {op_class(o) for o in ("silu_mul", "gelu_tanh_mul")} == {"activation"}
    assert op_class("rope") == "rope" and op_class("softmax") == "softmax"


def test_same_bottleneck_is_nearer_than_same_name_elsewhere():
    rms = Fingerprint.from_target(target("rms_norm", (1, 1, 1536)), "nvidia-h200")
    layer = Fingerprint.from_target(target("layer_norm", (1, 1, 768)), "nvidia-h200")
    silu = Fingerprint.from_target(target("silu_mul", (1, 1, 8960)), "nvidia-h200")
    rms_cpu = Fingerprint.from_target(target("rms_norm", (2, 16, 64), "memory-bound", "float32"), "cpu")
    rms_prefill = Fingerprint.from_target(target("rms_norm", (4, 512, 1536), "memory-bound"), "nvidia-h200")
    assert layer.similarity(rms) > 0.9
    assert layer.similarity(rms) > layer.similarity(silu) + 0.2
    assert rms.similarity(rms_prefill) > rms.similarity(silu)
    assert rms.similarity(rms_cpu) < rms.similarity(layer)
    # The op name nudges: the same family ranks above a sibling family with the same physics.
    rms_768 = Fingerprint.from_target(target("rms_norm", (1, 1, 768)), "nvidia-h200")
    assert rms_768.similarity(rms) > layer.similarity(rms)
