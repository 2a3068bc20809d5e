"""SwapEngine in-process: commit all modules or none, rollback, fallback, manifest and re-apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpuyantra.swap import (
    CandidateLoadError,
    NotActiveError,
    ParityError,
    SwapEngine,
    SwapRejected,
    UnknownSwapError,
    swapped_id,
)
from serving.models import load_model
from tests.serving.candidates import ALWAYS_RAISES, BAD_ADAPTER, SYNTAX_ERROR, rms_norm_source
from tests.serving.helpers import RMS_NORM_KERNEL

NORMS = 5  # tiny-qwen2: 2 layers x 2 norms + the final norm


@pytest.fixture
def model():
    return load_model("tiny-qwen2").model


def norm_modules(model):
    return [m for n, m in model.named_modules() if type(m).__name__ == "Qwen2RMSNorm"]


def bound(model):
    return [swapped_id(m) for m in norm_modules(model)]


def untouched(model) -> bool:
    return all("forward" not in m.__dict__ for m in norm_modules(model))


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


IDS = torch.tensor([[5, 17, 300, 42, 7, 99, 256, 1]])


def test_swap_commits_every_module_and_rollback_restores(model, tmp_path):
    events = []
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2", on_event=lambda k, r, **i: events.append(k))
    want = logits(model, IDS)
    record = engine.swap(RMS_NORM_KERNEL)
    assert record.status == "committed" and record.modules == NORMS
    assert record.module_class == "Qwen2RMSNorm" and record.op == "rms_norm"
    # Two probe shapes per module, plus the first one again with eps moved off its live value.
    assert record.parity["checked"] == NORMS * 3 and record.parity["max_abs_err"] < 1e-4
    assert record.parity["perturbed_scalar_checks"] == NORMS
    assert bound(model) == [record.swap_id] * NORMS
    got = logits(model, IDS)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert record.calls == NORMS  # one served forward; parity calls are not counted
    # Kept file, loaded from the state folder.
    assert record.file == str(tmp_path / "swaps" / f"{record.swap_id}.py")
    assert (tmp_path / "swaps" / f"{record.swap_id}.py").read_text() == RMS_NORM_KERNEL.read_text()

    [rolled] = engine.rollback(record.swap_id)
    assert rolled.status == "rolled_back" and untouched(model)
    assert torch.equal(logits(model, IDS), want)
    assert events == ["committed", "rolled_back"]
    with pytest.raises(NotActiveError):
        engine.rollback(record.swap_id)
    with pytest.raises(UnknownSwapError):
        engine.rollback("swap-nope")


@pytest.mark.parametrize(
    "source, error, reason",
    [
        (rms_norm_source(scale=1.01), ParityError, "parity failed"),
        (ALWAYS_RAISES, ParityError, "ValueError: boom"),
        (BAD_ADAPTER, SwapRejected, "no_such_attr"),
        (SYNTAX_ERROR, CandidateLoadError, "SyntaxError"),
    ],
)
def test_failed_swap_changes_nothing(model, tmp_path, source, error, reason):
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    want = logits(model, IDS)
    with pytest.raises(error) as info:
        engine.swap(source=source)
    assert reason in info.value.reason
    assert untouched(model) and engine.active() == []
    assert torch.equal(logits(model, IDS), want)
    if error is CandidateLoadError:
        assert info.value.http_status == 422
        assert engine.history() == [] and not list((tmp_path / "swaps").glob("*.py"))
    else:
        assert info.value.http_status == 409
        [record] = engine.history()
        assert record["status"] == "rolled_back" and reason in record["reason"]


def test_failure_on_a_later_module_restores_the_earlier_ones(model, tmp_path):
    # Parity passes on the first modules and fails on the last: the earlier bindings are undone too.
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    with torch.no_grad():
        model.model.norm.weight.mul_(1e6)  # only the final norm sees huge values...
    src = rms_norm_source().replace("(normed * w * scale)", "(normed * tl.minimum(w, 1e5) * scale)")
    with pytest.raises(ParityError) as info:
        engine.swap(source=src)
    assert "model.norm" in info.value.reason
    assert untouched(model)


def test_module_class_filter_and_no_match(model, tmp_path):
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    record = engine.swap(RMS_NORM_KERNEL, module_class="Qwen2RMSNorm")
    assert record.modules == NORMS
    engine.rollback(all=True)
    with pytest.raises(SwapRejected) as info:
        engine.swap(RMS_NORM_KERNEL, module_class="transformers.models.llama.modeling_llama.LlamaRMSNorm")
    assert "no module of class" in info.value.reason
    assert untouched(model)


def test_newer_swap_supersedes_and_rollback_restores_original(model, tmp_path):
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    first = engine.swap(RMS_NORM_KERNEL)
    second = engine.swap(source=rms_norm_source())
    assert bound(model) == [second.swap_id] * NORMS
    assert first.status == "superseded" and first.superseded_by == second.swap_id
    assert [r["swap_id"] for r in engine.active()] == [second.swap_id]
    engine.rollback(second.swap_id)
    assert untouched(model)


def test_suspension_turns_a_swap_off_and_on_without_rolling_it_back(model, tmp_path):
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    first = engine.swap(RMS_NORM_KERNEL)
    second = engine.swap(source=rms_norm_source())  # supersedes the first: off means the original
    with engine.suspension(second.swap_id) as use:
        use(False)
        assert untouched(model) and engine.active_ids() == [second.swap_id]
        use(True)
        assert bound(model) == [second.swap_id] * NORMS
        use(False)
    assert bound(model) == [second.swap_id] * NORMS  # on again when the block ends
    with pytest.raises(RuntimeError, match="boom"), engine.suspension(second.swap_id) as use:
        use(False)
        raise RuntimeError("boom")
    assert bound(model) == [second.swap_id] * NORMS and second.status == "committed"
    with pytest.raises(NotActiveError), engine.suspension(first.swap_id):
        pass
    with pytest.raises(UnknownSwapError), engine.suspension("swap-nope"):
        pass


def test_kernel_raising_while_serving_falls_back_then_rolls_back(model, tmp_path):
    events = []
    engine = SwapEngine(
        model, tmp_path, model_id="tiny-qwen2", on_event=lambda k, r, **i: events.append((k, i.get("cause")))
    )
    long_ids = torch.arange(1, 13)[None]  # 12 rows
    want = logits(model, long_ids)
    record = engine.swap(source=rms_norm_source(max_rows=8), live_shapes=[[1, 1, 64], [1, 8, 64]])
    assert record.status == "committed"
    # The first norm raises on 12 rows: that call and the rest of the pass use the original forward.
    assert torch.equal(logits(model, long_ids), want)
    assert record.fallbacks == NORMS and "12 rows" in record.last_error
    assert engine.pending_faults() and record.status == "committed"
    [rolled] = engine.handle_faults()  # the serving loop calls this between forward passes
    assert rolled.swap_id == record.swap_id and rolled.status == "rolled_back"
    assert "raised while serving" in rolled.reason
    assert untouched(model) and not engine.pending_faults()
    assert ("fallback", None) in events and ("rolled_back", "fallback") in events


def test_manifest_persists_and_reapply_rechecks_parity(tmp_path):
    first_model = load_model("tiny-qwen2").model
    engine = SwapEngine(first_model, tmp_path, model_id="tiny-qwen2")
    keep = engine.swap(RMS_NORM_KERNEL)
    gone = engine.swap(source=rms_norm_source(), module_class="Qwen2RMSNorm")  # supersedes keep
    engine.rollback(gone.swap_id)
    kept = engine.swap(source=rms_norm_source())
    broken = engine.swap(RMS_NORM_KERNEL)  # will be made wrong on disk before the restart
    manifest = json.loads((tmp_path / "swaps" / "manifest.json").read_text())
    assert [r["swap_id"] for r in manifest["swaps"]] == [keep.swap_id, gone.swap_id, kept.swap_id, broken.swap_id]
    assert [r["status"] for r in manifest["swaps"]] == ["superseded", "rolled_back", "superseded", "committed"]

    # Restart 1: the committed swap comes back with its id.
    model2 = load_model("tiny-qwen2").model
    engine2 = SwapEngine(model2, tmp_path, model_id="tiny-qwen2")
    assert engine2.active() == []
    assert engine2.reapply() == [{"swap_id": broken.swap_id, "status": "committed", "reapplied": True}]
    assert bound(model2) == [broken.swap_id] * NORMS
    assert engine2.active()[0]["reapplied_at"] is not None

    # Restart 2: the kept file changed on disk (it would no longer pass parity either) -> not imported,
    # not bound, recorded as rolled back: only the bytes swapped in (and admitted) come back.
    Path(broken.file).write_text(rms_norm_source(scale=0.5))
    model3 = load_model("tiny-qwen2").model
    engine3 = SwapEngine(model3, tmp_path, model_id="tiny-qwen2")
    [result] = engine3.reapply()
    assert result["status"] == "rolled_back" and "re-check on restart failed" in result["reason"]
    assert "changed since it was swapped in" in result["reason"]
    assert untouched(model3)
    manifest = json.loads((tmp_path / "swaps" / "manifest.json").read_text())
    statuses = {r["swap_id"]: r["status"] for r in manifest["swaps"]}
    assert statuses[broken.swap_id] == "rolled_back"

    # Another model's records are left alone.
    other = SwapEngine(load_model("tiny-llama").model, tmp_path, model_id="tiny-llama")
    assert other.reapply() == []


def test_before_commit_hook_failure_restores_and_recaptures(model, tmp_path):
    calls = []

    def before_commit(record):
        calls.append(("before", bound(model)))
        with engine.previous_forwards():
            calls.append(("previous", bound(model)))
        raise RuntimeError("graph parity failed")

    engine = SwapEngine(
        model,
        tmp_path,
        model_id="tiny-qwen2",
        before_commit=before_commit,
        after_restore=lambda: calls.append(("restore", bound(model))),
    )
    with pytest.raises(ParityError, match="graph parity failed"):
        engine.swap(RMS_NORM_KERNEL)
    sid = engine.history()[0]["swap_id"]
    assert calls == [("before", [sid] * NORMS), ("previous", [None] * NORMS), ("restore", [None] * NORMS)]
    assert untouched(model) and engine.active() == []


def test_kernel_ignoring_the_modules_eps_fails_parity_and_nothing_changes(model, tmp_path):
    """Parity moves each bound float attribute (eps) on the module itself: a baked-in constant fails."""
    baked = Path(__file__).parents[1] / "verifier" / "candidates" / "cheat_baked_eps.py"
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    want = logits(model, IDS)
    with pytest.raises(ParityError):
        engine.swap(baked)
    assert untouched(model) and engine.active() == []
    assert all(m.variance_epsilon == model.config.rms_norm_eps for m in norm_modules(model))
    assert torch.equal(logits(model, IDS), want)


def test_swap_imports_the_bytes_it_admitted(model, tmp_path):
    """The file is read once: what `admit` (the attestation check) saw is what is compiled, even
    where the kept copy changes between the check and the import."""
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    seen: list[bytes] = []

    def admit(data: bytes) -> None:
        seen.append(data)
        for kept in (tmp_path / "swaps").glob("*.py"):  # a wrong kernel in its place, after the check
            kept.write_text(rms_norm_source(scale=0.5))
        return None

    record = engine.swap(source=rms_norm_source(), admit=admit)
    assert record.status == "committed" and seen == [rms_norm_source().encode()]
