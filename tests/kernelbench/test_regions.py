"""A whole model in fusable regions (KernelBench level 3): the partition of small models written
here, the module-tree fallback, and one end-to-end run on CPU where ModelNew composes the regions'
verified kernels with a region whose kernel was rejected (the LLM author, against a local fake
server, writes a wrong kernel for the costliest region; the template author writes the others)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpuyantra import kernelbench as kb
from gpuyantra.kernelbench.regions import Partition, partition, rank_by_cost
from tests.authors.fake_llm_server import FakeLLM, Reply, reply_json


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.view(x.size(0), -1))


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return torch.tanh(self.fc2(h) + x)


class Branchy(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        if h.sum() > 0:
            h = h * 2
        return self.fc2(h)


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return torch.sigmoid(self.fc(out[:, -1, :]))


def run_regions_in_order(found: Partition, x: torch.Tensor) -> Any:
    """The forward rebuilt from the regions' sub-modules alone (traced partitions): each region's
    inputs looked up by the names the Model's code gives them."""
    values: dict[str, Any] = {"x": x}
    for region in found.regions:
        out = region.module(*[values[name] for name in region.input_names])
        outs = out if len(region.output_names) > 1 else (out,)
        values.update(zip(region.output_names, outs))
    return values[found.regions[-1].output_names[-1]]


def test_conv_bn_relu_pool_linear_is_an_anchor_with_its_epilogue_then_the_linear():
    model, x = ConvNet().eval(), torch.randn(2, 3, 8, 8)
    found = partition(model, [x])
    assert found.traced
    assert [r.ops for r in found.regions] == [
        ["Conv2d conv", "BatchNorm2d bn", "relu", "max_pool2d", "view"],
        ["Linear fc"],
    ]
    assert [r.kind for r in found.regions] == ["anchor", "anchor"]
    first, second = found.regions
    # Parameters keep the Model's dotted paths (ModelNew binds them as self.conv.weight).
    assert {"conv.weight", "conv.bias", "bn.weight", "bn.bias"} <= set(dict(first.module.named_parameters()))
    assert [tuple(t.shape) for t in first.inputs] == [(2, 3, 8, 8)]
    assert [tuple(t.shape) for t in second.inputs] == [(2, 128)]  # the live shape after the pool and view
    with torch.no_grad():  # live values (the second run's), not the first run's meta stand-ins
        torch.testing.assert_close(second.inputs[0], first.module(x))
    with torch.no_grad():
        torch.testing.assert_close(run_regions_in_order(found, x), model(x))


def test_an_mlp_with_a_residual_takes_the_residual_as_a_second_input():
    model, x = ResidualMLP(), torch.randn(4, 16)
    found = partition(model, [x])
    assert [r.ops for r in found.regions] == [["Linear fc1", "relu"], ["Linear fc2", "add", "tanh"]]
    assert [r.input_names for r in found.regions] == [["x"], ["relu", "x"]]
    assert [[tuple(t.shape) for t in r.inputs] for r in found.regions] == [[(4, 16)], [(4, 32), (4, 16)]]
    with torch.no_grad():
        torch.testing.assert_close(run_regions_in_order(found, x), model(x))
    ranked = rank_by_cost(found.regions, "cpu")
    assert sum(r.share for r in ranked) == pytest.approx(1.0)
    assert [r.cost_us for r in ranked] == sorted((r.cost_us for r in ranked), reverse=True)
    assert all(r.cost_basis == "estimate" and r.cost_us > 0 for r in ranked)


def test_a_model_fx_cannot_trace_falls_back_to_its_module_tree():
    model, x = Branchy(), torch.randn(3, 8)
    found = partition(model, [x])
    assert not found.traced and found.why_untraced  # fx's reason, for the log
    assert [(r.child, r.kind) for r in found.regions] == [("fc1", "anchor"), ("act", "chain"), ("fc2", "anchor")]
    assert [tuple(r.inputs[0].shape) for r in found.regions] == [(3, 8), (3, 8), (3, 8)]


def test_a_recurrent_layer_is_kept_whole_in_the_library():
    found = partition(Recurrent(), [torch.randn(2, 5, 8)])
    kinds = [(r.kind, r.ops) for r in found.regions]
    assert kinds[0] == ("library", ["LSTM lstm"])
    assert ("anchor", ["Linear fc", "sigmoid"]) in kinds


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.attn(x, x, x)
        return self.norm(out + x)


def test_what_follows_an_attention_layer_takes_its_output_tensor_not_its_tuple():
    x = torch.randn(5, 2, 8)
    found = partition(Attention(), [x])
    assert [(r.kind, r.ops) for r in found.regions] == [
        ("library", ["MultiheadAttention attn"]),
        ("chain", ["add", "LayerNorm norm"]),
    ]
    after = found.regions[1]
    assert all(isinstance(t, torch.Tensor) for t in after.inputs) and after.input_shapes == [[5, 2, 8], [5, 2, 8]]


class Inception(nn.Module):
    """Branches over one input, a downsampled residual, a concatenation: regions interleave."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.branch1 = nn.Conv2d(8, 4, 1)
        self.branch3 = nn.Sequential(nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
        self.pool_proj = nn.Conv2d(8, 4, 1)
        self.down = nn.Sequential(nn.Conv2d(8, 12, 1, stride=2), nn.BatchNorm2d(12))
        self.head = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.stem(x))
        pooled = self.pool_proj(F.max_pool2d(s, 3, stride=1, padding=1))
        out = torch.cat([self.branch1(s), self.branch3(s), pooled], dim=1)
        out = F.avg_pool2d(out, 2) + self.down(s)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(torch.relu(out), 1), 1))


def test_the_composed_forward_with_every_region_replaced_reproduces_the_model():
    from gpuyantra.kernelbench.compose import RegionKernel, composed_forward

    model, x = Inception().eval(), torch.randn(2, 3, 8, 8)
    found = partition(model, [x])
    assert len(found.regions) >= 6
    kernels = {r.index: RegionKernel(r, Path("unused.py"), []) for r in found.regions}
    namespace: dict[str, Any] = {}
    exec(composed_forward(found, kernels), namespace)
    # Each region's call runs the region's own sub-module: the composition alone is under test.
    methods = {f"_gy_{r.name}": (lambda sub: lambda self, *args: sub(*args))(r.module) for r in found.regions}
    composed = type("Composed", (Inception,), {"forward": namespace["forward"], **methods})
    with torch.no_grad():
        want = model(x)
        model.__class__ = composed
        torch.testing.assert_close(model(x), want)


# --- end to end --------------------------------------------------------------------------------

THREE_REGIONS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, features)
        self.fc3 = nn.Linear(features, features)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        y = torch.tanh(self.fc2(h) + x)
        return torch.sigmoid(self.fc3(y))


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16, 32]
"""

# A kernel that ignores its weights: the verifier rejects it on values.
WRONG_KERNEL = """
import torch

OP = "{op}"
ADAPTER = []


def entry(*inputs, **params):
    return inputs[0].clone()
"""


class WrongFirstLLM(FakeLLM):
    """Answers the first request (the costliest region) with a wrong kernel for the op it names,
    and every later one with an error, so the LLM author falls back to the template author."""

    def _next(self) -> Reply:
        with self._lock:
            chats = [r for r in self.requests if r.api == "openai"]  # not the model listing
            count, body = len(chats), chats[-1].body
        if count == 1:
            op = re.search(r"open\.three_regions_region_\d+_[0-9a-f]+", json.dumps(body))
            assert op is not None, "the prompt names the region's open target"
            return Reply(text=reply_json(WRONG_KERNEL.format(op=op.group(0)), []))
        return Reply(status=400, body={"error": {"message": "no more kernels"}})


@pytest.fixture(scope="module")
def three_regions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[kb.RunResult, Path]]:
    folder = tmp_path_factory.mktemp("regions")
    (folder / "three_regions.py").write_text(THREE_REGIONS)
    server = WrongFirstLLM().start()
    patch = pytest.MonkeyPatch()
    try:
        patch.setenv("GPUYANTRA_AUTHOR", "openai")
        patch.setenv("GPUYANTRA_LLM_BASE_URL", f"{server.url}/v1")
        patch.setenv("GPUYANTRA_LLM_MAX_ATTEMPTS", "1")
        result = kb.run(folder / "three_regions.py", device="cpu", out=folder / "out", max_iterations=1)
        yield result, folder / "out"
    finally:
        patch.undo()
        server.stop()


def test_model_new_composes_the_verified_region_kernels_and_matches_model_in_float64(three_regions):
    result, out = three_regions
    problem = result.problems[0]
    assert problem.op == "regions" and problem.status == "optimized" and problem.correct, problem.reason
    assert "against Model in float64" in problem.reason
    kept = [r for r in problem.regions if r["runs_as"] == "kernel"]
    assert len(kept) == 2 and all(r["status"] == "verified" and r["reward"] >= 1 for r in kept)
    assert "2 of 3 regions run verified kernels" in problem.reason
    source = Path(problem.model_new).read_text()
    for region in kept:  # each kept kernel is one method of ModelNew, called from its forward
        assert f"self._gy_{region['name']}(" in source
        assert (out / "three_regions" / region["name"] / Path(region["candidate"]).name).is_file()
    saved = json.loads((out / "kernelbench.json").read_text())["problems"][0]["regions"]
    assert [r["name"] for r in saved] == ["region_0", "region_1", "region_2"]
    assert sum(r["share"] for r in saved) == pytest.approx(1.0, abs=1e-3)


def test_a_region_whose_kernel_is_rejected_stays_the_models_own_and_says_why(three_regions):
    result, _ = three_regions
    regions = result.problems[0].regions
    rejected = [r for r in regions if r["status"] == "rejected"]
    assert len(rejected) == 1
    wrong = rejected[0]
    assert wrong["share"] == max(r["share"] for r in regions)  # the costliest region was tried first
    assert wrong["runs_as"] == "unchanged" and wrong["reward"] == -1
    assert wrong["reason"].startswith("rejected: no candidate passed verification")
    assert re.search(r"\(\w+/[\w-]+: ", wrong["reason"])  # the verifier's layer/rule and message
    source = Path(result.problems[0].model_new).read_text()
    assert f"self._gy_{wrong['name']}(" not in source


# --- composing ModelNew (entries written here in torch: the composition alone is under test) ----

INTERLEAVED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_a = nn.Linear(8, 8)
        self.fc_b = nn.Linear(8, 8)

    def forward(self, x):
        a = self.fc_a(x)
        c = self.fc_b(a)
        d = torch.relu(a)  # joins fc_a's region after fc_b's region began
        return c * d


def get_inputs():
    return [torch.randn(3, 8)]


def get_init_inputs():
    return []
"""

REGION_0_ENTRY = """
import torch

calls = []


def entry(x, fc_a_weight, fc_a_bias):
    calls.append(x.shape)
    a = torch.nn.functional.linear(x, fc_a_weight, fc_a_bias)
    return a, torch.relu(a)
"""

GELU_ENTRY = """
import torch

calls = []


def entry(x):
    calls.append(x.shape)
    return torch.nn.functional.gelu(x)
"""


def compose_and_load(tmp_path: Path, source: str, found: Partition, kernels: dict[int, Any]) -> Any:
    from gpuyantra.kernelbench.compose import model_new_source
    from gpuyantra.kernelbench.model_new import load_model_new

    problem = tmp_path / "problem.py"
    problem.write_text(source)
    path = tmp_path / "ModelNew.py"
    path.write_text(model_new_source(source, problem, found, kernels, tmp_path))
    return load_model_new(path)


def kernel_file(folder: Path, region: int, source: str) -> Path:
    path = folder / f"region_{region}" / "candidate_1.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def test_a_replaced_region_runs_before_the_regions_that_use_its_outputs(tmp_path):
    from gpuyantra.kernelbench.compose import RegionKernel

    namespace: dict[str, Any] = {}
    exec(INTERLEAVED, namespace)
    torch.manual_seed(0)
    model, x = namespace["Model"](), torch.randn(3, 8)
    found = partition(model, [x])
    assert [r.ops for r in found.regions] == [["Linear fc_a", "relu"], ["Linear fc_b", "mul"]]
    assert found.regions[0].output_names == ["fc_a", "relu"]
    first = found.regions[0]
    first.reward = 1
    adapter = [{"kernel_param": f"fc_a_{p}", "module_attr": f"fc_a.{p}"} for p in ("weight", "bias")]
    kernels = {0: RegionKernel(first, kernel_file(tmp_path, 0, REGION_0_ENTRY), adapter)}
    new_module = compose_and_load(tmp_path, INTERLEAVED, found, kernels)
    torch.manual_seed(0)
    model_new = new_module.ModelNew()
    assert model_new.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(model_new(x), model(x))
    assert new_module._gy_region_0_kernel.calls == [x.shape]  # the kernel ran fc_a's region, once


def test_a_module_tree_model_new_points_the_childs_forward_at_its_kernel(tmp_path):
    from gpuyantra.kernelbench.compose import RegionKernel

    source = BRANCHY_PROBLEM
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    torch.manual_seed(0)
    model, x = namespace["Model"](), torch.randn(3, 8)
    found = partition(model, [x])
    assert not found.traced
    act = next(r for r in found.regions if r.child == "act")
    act.reward = 1
    path = kernel_file(tmp_path, act.index, GELU_ENTRY.replace("calls = []", "calls = []  # tree"))
    new_module = compose_and_load(tmp_path, source, found, {act.index: RegionKernel(act, path, [])})
    torch.manual_seed(0)
    model_new = new_module.ModelNew()
    assert model_new.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(model_new(x), model(x))
    kernel = new_module._gy_region_1_kernel
    assert kernel.calls == [x.shape]  # the child's forward ran the kernel, once


BRANCHY_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        h = self.act(self.fc1(x))
        if h.sum() > 0:
            h = h * 2
        return self.fc2(h)


def get_inputs():
    return [torch.randn(3, 8)]


def get_init_inputs():
    return []
"""


REPEATED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
        self.strided = nn.Conv1d(8, 8, 3, stride=2)
        self.plain = nn.Conv1d(8, 8, 3)

    def forward(self, x, y):
        for block in self.blocks:
            x = torch.relu(block(x))
        return x.sum() + torch.relu(self.strided(y)).sum() + torch.relu(self.plain(y)).sum()


def get_inputs():
    return [torch.randn(6, 8), torch.randn(1, 8, 9)]


def get_init_inputs():
    return []
"""

LINEAR_RELU_ENTRY = """
import torch

calls = []


def entry(x, blocks_0_weight, blocks_0_bias):
    calls.append(blocks_0_weight.data_ptr())
    return torch.relu(torch.nn.functional.linear(x, blocks_0_weight, blocks_0_bias))
"""


def test_a_repeated_block_takes_the_kernel_of_its_first_instance_with_its_own_parameters(tmp_path):
    from gpuyantra.kernelbench.compose import RegionKernel
    from gpuyantra.kernelbench.problems import load_module
    from gpuyantra.kernelbench.region_loop import _reuse
    from gpuyantra.kernelbench.regions import signature

    problem = tmp_path / "repeated.py"
    problem.write_text(REPEATED)
    module = load_module(problem)
    torch.manual_seed(0)
    model, x, y = module.Model(), torch.randn(6, 8), torch.randn(1, 8, 9)
    found = partition(model, [x, y])
    first, second, _, strided, plain = (r for r in found.regions if r.kind == "anchor")
    assert signature(first) == signature(second)
    assert signature(strided) != signature(plain)  # the same weights' shapes, another stride
    first.reward, first.status = 1, "verified"
    adapter = [{"kernel_param": f"blocks_0_{p}", "module_attr": f"blocks.0.{p}"} for p in ("weight", "bias")]
    kept = RegionKernel(first, kernel_file(tmp_path, first.index, LINEAR_RELU_ENTRY), adapter)
    reused = _reuse(second, first, kept, "repeated", problem, module)
    assert reused is not None and second.runs_as == "kernel" and second.reason.startswith("region_0's kernel")
    assert reused.adapter == [
        {"kernel_param": "blocks_0_weight", "module_attr": "blocks.1.weight"},
        {"kernel_param": "blocks_0_bias", "module_attr": "blocks.1.bias"},
    ]
    new_module = compose_and_load(tmp_path, REPEATED, found, {first.index: kept, second.index: reused})
    torch.manual_seed(0)
    model_new = new_module.ModelNew()
    with torch.no_grad():
        torch.testing.assert_close(model_new(x, y), model(x, y))
    weights = [model_new.blocks[0].weight.data_ptr(), model_new.blocks[1].weight.data_ptr()]
    assert new_module._gy_region_0_kernel.calls == weights  # one kernel, each block's own weights


RECURRENT_PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1, :])


def get_inputs():
    return [torch.randn(2, 5, 8)]


def get_init_inputs():
    return []
"""


def test_library_layers_lone_anchors_and_views_get_no_kernel_and_say_why(tmp_path):
    from gpuyantra.kernelbench.problems import load_module
    from gpuyantra.kernelbench.region_loop import no_kernel_reason, optimize_regions

    problem = tmp_path / "recurrent.py"
    problem.write_text(RECURRENT_PROBLEM)
    module = load_module(problem)
    found = partition(module.Model(), [torch.randn(2, 5, 8)])
    run = optimize_regions(found, "recurrent", problem, module, tmp_path / "out", "cpu", 1, lambda _: None)
    outcome = {r.ops[0]: (r.status, r.runs_as, r.reason) for r in run.regions}
    assert outcome["LSTM lstm"] == ("library", "library", "kept whole in the library (a recurrent or attention layer)")
    assert outcome["Linear fc"][:2] == ("library", "library") and "nothing to fuse" in outcome["Linear fc"][2]
    assert outcome["getitem"][:2] == ("not_tried", "unchanged") and "views" in outcome["getitem"][2]
    assert not run.kernels and not (tmp_path / "out").exists()  # nothing was written or verified
    status, reason = no_kernel_reason(run)
    assert status == "unsupported" and reason.startswith("no region kept a kernel (3 regions): region_0: kept whole")
