"""Under CUDA graphs a function-level target (rope's `apply_rotary_pos_emb`) costs the step its
kernel time, not the host-inclusive wall time its timer measures: the profile takes each site's
kernel time from labelled profiler ranges (0 on a CPU, where no kernel runs)."""

from __future__ import annotations

import torch

from gpuyantra.function_sites import find_function_sites
from gpuyantra.hardware import cpu_spec
from gpuyantra.profiler.targets import _function_targets, _PhaseContext, _site_kernel_us
from serving.models import load_model


def rope_sites_and_probe():
    model = load_model("tiny-qwen2").model
    sites = find_function_sites(model, ["rope"])
    ids = torch.tensor([[1, 2, 3, 4]])
    return model, sites, lambda: model(input_ids=ids, use_cache=False)


def test_each_site_call_is_one_labelled_range_and_the_sites_are_put_back():
    model, sites, probe = rope_sites_and_probe()
    assert sites
    before = {s.dotted: s.current() for s in sites}
    kernels = _site_kernel_us(sites, before, probe, lambda: None)
    layers = model.config.num_hidden_layers
    assert sum(calls for _, calls in kernels.values()) == layers
    assert all(us == 0.0 for us, _ in kernels.values())  # no kernels on a CPU
    assert {s.dotted: s.current() for s in sites} == before


def test_a_graphed_phase_costs_a_function_target_its_kernel_time():
    _, sites, probe = rope_sites_and_probe()
    eager = _PhaseContext(cuda=False, spec=cpu_spec(), step_us=1000.0, busy=1.0, steps=1)
    graphed = _PhaseContext(cuda=True, spec=cpu_spec(), step_us=1000.0, busy=1.0, steps=1, graphed=True)
    [timed] = _function_targets(eager, sites, probe, lambda: None)
    [replayed] = _function_targets(graphed, sites, probe, lambda: None)
    assert timed["device_us"] > 0 and timed["host_us"] > 0
    assert replayed["device_us"] == 0.0 and replayed["host_us"] > 0  # the host time is not the step's
    assert replayed["est_gain_us"] <= 0.0 < timed["cost_us"]
