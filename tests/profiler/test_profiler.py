"""The live-model profiler on a tiny random Qwen2 (CPU; the CUDA test runs where a GPU is)."""

from __future__ import annotations

import json

import pytest
import torch

from gpuyantra.binding import find_module_groups
from gpuyantra.hardware import HardwareSpec, class_from_name, get_hardware, hardware_class
from gpuyantra.ops import all_ops
from gpuyantra.profiler import IN_SITU_LAUNCH_FACTOR, estimate_gain, profile_model

TARGET_FIELDS = {
    "op",
    "module_class",
    "qualified_class",
    "modules",
    "adapter",
    "shapes",
    "dtype",
    "regime",
    "share",
    "device_us",
    "host_us",
    "launches",
    "arithmetic_intensity",
    "floor_us",
    "est_gain",
    "why",
}


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=256,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def decode_probe(model, batch=1, context=8):
    """One decode token per call on a KV cache (works with `cache` and `past_key_values` naming)."""
    import inspect

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 256, (batch, context)), use_cache=True)
    state = {"cache": getattr(out, "cache", None) or out.past_key_values}

    def decode():
        out = model(input_ids=torch.randint(0, 256, (batch, 1)), use_cache=True, **{kw: state["cache"]})
        state["cache"] = getattr(out, "cache", None) or out.past_key_values

    return decode


def test_positional_form_on_cpu(tiny):
    ids = torch.randint(0, 256, (2, 16))
    result = profile_model(tiny, lambda: tiny(input_ids=ids), "cpu")
    json.dumps(result)  # the admin endpoint returns it as is
    assert result["device"] == "cpu" and result["hardware"] == "cpu"
    assert set(result["phases"]) == {"probe"} and result["primary_phase"] == "probe"
    assert result["step_ms"] > 0 and 0 < result["busy_fraction"] <= 1 and result["launches_per_step"] > 0
    assert result["regime"] in {"memory-bound", "compute-bound", "launch-bound"}
    assert result["hardware_spec"]["measured"] is False

    targets = result["targets"]
    norm = next(t for t in targets if t["op"] == "rms_norm")
    assert TARGET_FIELDS <= set(norm)
    assert norm["module_class"] == "Qwen2RMSNorm"
    assert norm["qualified_class"] == "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm"
    assert norm["modules"] == 5  # 2 layers x 2 norms + the final norm
    assert norm["adapter"] == [
        {"kernel_param": "weight", "module_attr": "weight"},
        {"kernel_param": "eps", "module_attr": "variance_epsilon"},
    ]
    assert norm["shapes"] == [[2, 16, 64]] and norm["dtype"] == "float32"
    assert norm["calls"] == 5 and norm["launches"] >= 5 and norm["launches_per_call"] >= 1
    assert norm["regime"] == "memory-bound"  # AI ~0.5 FLOP/B, far below the CPU ridge
    assert 0 < norm["arithmetic_intensity"] < 2 and norm["floor_us"] > 0
    assert 0 < norm["share"] < 1 and norm["host_us"] > 0 and norm["device_us"] > 0
    assert norm["why"].startswith("cpu:")
    # Ranked by estimated effect on served latency.
    gains = [t["est_gain"] for t in targets]
    assert gains == sorted(gains, reverse=True) and [t["rank"] for t in targets] == list(range(1, len(targets) + 1))
    # One entry per (op, class, live parameter shapes); module-class breakdown covers the step.
    assert len({(t["op"], t["qualified_class"], t.get("variant", "")) for t in targets}) == len(targets)
    classes = result["phases"]["probe"]["classes"]
    assert {"Linear", "Qwen2RMSNorm", "Qwen2Attention"} <= {c["module_class"] for c in classes}
    assert 0.5 < sum(c["share"] for c in classes) < 1.5


def test_decode_and_prefill_probes(tiny):
    ids = torch.randint(0, 256, (2, 16))
    result = profile_model(
        tiny,
        # logits_to_keep=1: the head projects `h[:, -1:, :]`, a view at an offset, as served prefill does.
        probes={
            "prefill": lambda: tiny(input_ids=ids, use_cache=False, logits_to_keep=1),
            "decode": decode_probe(tiny),
        },
        device="cpu",
        repeat=2,
        profile_steps=1,
    )
    assert set(result["phases"]) == {"prefill", "decode"} and result["primary_phase"] == "decode"
    assert result["weights"] == {"prefill": 1.0, "decode": 32.0}
    assert result["step_ms"] == result["phases"]["decode"]["step_ms"]
    norm = next(t for t in result["targets"] if t["op"] == "rms_norm")
    assert norm["shapes"] == [[1, 1, 64], [2, 16, 64]]  # decode first: it dominates served latency
    assert norm["phases"]["decode"]["shapes"] == [[1, 1, 64]]
    assert norm["phases"]["prefill"]["shapes"] == [[2, 16, 64]]
    assert 0 < norm["share"] < 1
    decode_norm = next(t for t in result["phases"]["decode"]["targets"] if t["op"] == "rms_norm")
    assert decode_norm["calls"] == 5
    # The plan's live inputs: every row count of every phase, and the layouts a kernel is handed.
    assert norm["row_counts"] == [1, 32] and norm["layouts"] == []
    head = next(t for t in result["targets"] if t.get("variant") == "weight=256x64,bias=none")
    assert head["row_counts"] == [1, 2]
    assert head["layouts"] == [{"input": 0, "shape": [2, 1, 64], "stride": [1024, 64, 1], "offset": 960}]

    if any(f.name == "silu_mul" for f in all_ops()):
        # The gated MLP's op sees (gate, up) of the intermediate size, not the MLP's input.
        mlp = next(t for t in result["targets"] if t["op"] == "silu_mul")
        assert mlp["module_class"] == "Qwen2MLP" and mlp["modules"] == 2
        assert mlp["shapes"] == [[1, 1, 128], [2, 16, 128]]
        assert mlp["adapter"] == []


def test_leaves_the_model_as_it_was(tiny):
    ids = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        before = tiny(input_ids=ids).logits
    groups = find_module_groups(tiny, ["rms_norm"])
    result = profile_model(
        tiny, {"probe": lambda: tiny(input_ids=ids)}, "cpu", groups=groups, repeat=1, profile_steps=1
    )
    assert [t["op"] for t in result["targets"]] == ["rms_norm"]
    for module in tiny.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert "forward" not in module.__dict__
    with torch.no_grad():
        assert torch.equal(tiny(input_ids=ids).logits, before)


def test_probe_arguments_are_checked(tiny):
    with pytest.raises(TypeError):
        profile_model(tiny, None, "cpu")


H200 = HardwareSpec(
    name="nvidia-h200",
    device="cuda",
    device_name="NVIDIA H200",
    copy_bytes_per_s=4.3e12,
    matmul_flops_per_s=780e12,
    launch_us=5.0,
    triton_launch_us=15.0,
    measured=True,
)


def test_launch_bound_gain_comes_only_from_fewer_launches():
    # Batch-1 decode: GPU busy ~25%. 57 eager RMSNorm calls of 8 launches each.
    regime, cost, after, gain = estimate_gain(
        cuda=True,
        host_bound=True,
        spec=H200,
        host_us=57 * 50.0,
        device_us=57 * 8 * 2.5,
        calls=57,
        launches=57 * 8,
        floor_us=57 * 0.002,
        arithmetic_intensity=0.67,
    )
    assert regime == "launch-bound"
    assert cost == 57 * 50.0 and after == pytest.approx(57 * 15.0 * IN_SITU_LAUNCH_FACTOR)
    assert gain == pytest.approx(57 * (50.0 - 15.0 * IN_SITU_LAUNCH_FACTOR))
    # Same module class already at one launch per call: no gain however fast the kernel.
    regime, _, _, gain = estimate_gain(
        cuda=True,
        host_bound=True,
        spec=H200,
        host_us=57 * 12.0,
        device_us=57 * 3.0,
        calls=57,
        launches=57,
        floor_us=57 * 0.002,
        arithmetic_intensity=0.67,
    )
    assert regime == "launch-bound" and gain <= 0
    # A swap whose Triton launch costs more host time than the eager path makes decode slower.
    _, _, _, gain = estimate_gain(
        cuda=True,
        host_bound=True,
        spec=H200,
        host_us=57 * 20.0,
        device_us=57 * 4.0,
        calls=57,
        launches=57 * 2,
        floor_us=1.0,
        arithmetic_intensity=0.67,
    )
    assert gain < 0


def test_device_bound_gain_is_the_distance_to_the_roofline():
    regime, cost, after, gain = estimate_gain(
        cuda=True,
        host_bound=False,
        spec=H200,
        host_us=900.0,
        device_us=1200.0,
        calls=57,
        launches=57 * 8,
        floor_us=400.0,
        arithmetic_intensity=0.67,
    )
    assert regime == "memory-bound" and cost == 1200.0
    assert after == pytest.approx(500.0) and gain == pytest.approx(700.0)
    regime, *_ = estimate_gain(
        cuda=True,
        host_bound=False,
        spec=H200,
        host_us=1.0,
        device_us=500.0,
        calls=1,
        launches=1,
        floor_us=100.0,
        arithmetic_intensity=5000.0,
    )
    assert regime == "compute-bound"


def test_hardware_classes_and_cpu_spec():
    assert class_from_name("NVIDIA H200") == "nvidia-h200"
    assert class_from_name("NVIDIA H100 80GB HBM3") == "nvidia-h100"
    assert class_from_name("NVIDIA A100-SXM4-80GB") == "nvidia-a100"
    assert class_from_name("NVIDIA L4") == "nvidia-l4"
    assert class_from_name("NVIDIA GeForce RTX 4090") == "nvidia-rtx-4090"
    assert hardware_class("cpu") == "cpu"
    spec = get_hardware("cpu")
    assert spec.name == "cpu" and spec.measured is False and spec.ridge > 1
    assert spec.floor_us(1e6, 0) == pytest.approx(1e6 / spec.copy_bytes_per_s * 1e6)
    assert spec.regime(0.5) == "memory-bound" and spec.regime(1e4) == "compute-bound"
    assert HardwareSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_profile_attributes_kernels(tiny, tmp_path):
    model = tiny.to(device="cuda", dtype=torch.bfloat16)
    try:
        ids = torch.randint(0, 256, (1, 8), device="cuda")
        result = profile_model(model, {"prefill": lambda: model(input_ids=ids, use_cache=False)}, "cuda")
        phase = result["phases"]["prefill"]
        assert result["hardware"].startswith("nvidia") and result["hardware_spec"]["measured"] is True
        assert (tmp_path / "state" / "hardware" / f"{result['hardware']}.json").exists()
        assert 0 < phase["busy_fraction"] <= 1 and phase["launches_per_step"] > 10
        assert phase["attributed_fraction"] > 0.5
        norm = next(t for t in result["targets"] if t["op"] == "rms_norm")
        assert norm["device_us"] > 0 and norm["launches"] >= 5 and norm["dtype"] == "bfloat16"
        assert norm["regime"] in {"launch-bound", "memory-bound"}
    finally:
        tiny.to(device="cpu", dtype=torch.float32)


def test_linear_projections_are_targets_per_weight_shape(tiny):
    """Each projection shape is its own target (the campaign verifies and swaps it at that shape),
    ranked by measured time, with its live weight shape and a roofline over the real weight."""
    result = profile_model(tiny, probes={"decode": decode_probe(tiny)}, device="cpu", repeat=2, profile_steps=1)
    linear = [t for t in result["targets"] if t["op"] == "linear"]
    by_shape = {t["variant"]: t for t in linear}
    # q (bias), k/v (bias, 32 = 2 kv heads x 16), o, gate/up, down, lm_head
    assert set(by_shape) == {
        "weight=64x64,bias=64",
        "weight=32x64,bias=32",
        "weight=64x64,bias=none",
        "weight=128x64,bias=none",
        "weight=64x128,bias=none",
        "weight=256x64,bias=none",
    }
    head = by_shape["weight=256x64,bias=none"]
    assert head["param_shapes"] == {"weight": [256, 64], "bias": None} and head["modules"] == 1
    assert head["shapes"] == [[1, 1, 64]] and head["calls"] == 1
    assert head["bytes_per_step"] == (256 * 64 + 64 + 256) * 4  # the weight once, x and y
    down = by_shape["weight=64x128,bias=none"]
    assert down["shapes"] == [[1, 1, 128]] and down["modules"] == 2
    assert by_shape["weight=32x64,bias=32"]["modules"] == 4  # k_proj and v_proj of both layers
    ranks = [t["rank"] for t in result["targets"]]
    gains = [t["est_gain"] for t in result["targets"]]
    assert ranks == sorted(ranks) and gains == sorted(gains, reverse=True)


def test_a_phase_replayed_as_cuda_graphs_ranks_by_gpu_time():
    # Batch-1 decode of o_proj as eager sees it: GPU busy 10%, 28 one-launch calls of 54 us host and
    # 4.75 us GPU. Eager: launch-bound, a faster GEMV cannot help. Under CUDA graphs the host cost
    # leaves the step, and the distance to the roofline is the gain.
    from gpuyantra.profiler.targets import _PhaseContext

    def gain_in(ctx: _PhaseContext) -> tuple[str, float]:
        regime, _, _, gain = estimate_gain(
            cuda=True,
            host_bound=ctx.host_bound,
            spec=H200,
            host_us=1517.0,
            device_us=133.0,
            calls=28,
            launches=28,
            floor_us=31.0,
            arithmetic_intensity=1.0,
        )
        return regime, gain

    eager = _PhaseContext(cuda=True, spec=H200, step_us=28_000.0, busy=0.1, steps=2)
    graphed = _PhaseContext(cuda=True, spec=H200, step_us=2_800.0, busy=0.1, steps=2, graphed=True)
    assert eager.host_bound and not graphed.host_bound
    assert gain_in(eager)[0] == "launch-bound" and gain_in(eager)[1] <= 0
    regime, gain = gain_in(graphed)
    assert regime == "memory-bound" and gain > 0
    assert gain == pytest.approx(133.0 - max(31.0 / 0.8, 28 * H200.min_kernel_us))
    # On a CPU there are no graphs: the flag changes nothing.
    assert not _PhaseContext(cuda=False, spec=H200, step_us=1.0, busy=0.0, steps=1, graphed=True).host_bound
