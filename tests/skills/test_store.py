"""The skill store against a real local Qdrant folder: upsert, filtered retrieval, transfer across
families, bandit statistics across process restarts, JSONL round trip, the `skills` CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from gpuyantra.skills import Fingerprint, Skill, SkillStore, skill_id, ucb1_choose
from tests.skills.conftest import REPO, make_skill, run_cli, run_python


def test_upsert_is_keyed_by_op_hardware_and_source(qdrant_dir):
    skill = make_skill()
    assert skill.id == skill_id("rms_norm", "nvidia-h200", skill.source)
    with SkillStore(path=qdrant_dir) as store:
        first = store.upsert(skill)
        store.record_outcome(first, 3)
        # Same kernel again, new verdict: same record, bandit statistics and creation time kept.
        again = make_skill(reward=2)
        assert store.upsert(again) == first
        assert store.count() == 1
        stored = store.get(first)
        assert stored.reward == 2 and stored.pulls == 1 and stored.total_reward == 3
        # Another source, hardware or op is another skill.
        store.upsert(make_skill(variant="b"))
        store.upsert(make_skill(hardware="nvidia-l4"))
        assert store.count() == 3
    got = SkillStore(path=qdrant_dir).get(first)
    assert got.source == skill.source
    assert got.adapter == skill.adapter and got.strategy == skill.strategy
    assert got.provenance == {"campaign": "wf-1", "iteration": 1, "author": "template"}
    assert got.fingerprint["op_class"] == "norm" and got.fingerprint["hardware"] == "nvidia-h200"
    assert got.shapes == [[1, 1, 1536]] and got.dtypes == ["bfloat16"]
    assert got.versions.get("torch") and got.created_at and got.source_digest


def test_upsert_fills_fingerprint_when_missing(qdrant_dir):
    skill = Skill(op="rms_norm", hardware="cpu", source="OP = 'rms_norm'\n", shapes=[[2, 16, 64]], dtypes=["float32"])
    store = SkillStore(path=qdrant_dir)
    sid = store.upsert(skill)
    fp = store.get(sid).fingerprint
    assert fp["op"] == "rms_norm" and fp["hidden"] == 64 and fp["rows"] == 32 and fp["dtype"] == "float32"
    with pytest.raises(ValueError):
        store.upsert(Skill(op="rms_norm", hardware="cpu"))


def test_retrieval_filters_on_op_and_hardware(qdrant_dir):
    with SkillStore(path=qdrant_dir) as store:
        h200 = [store.upsert(make_skill(variant=v)) for v in ("a", "b")]
        store.upsert(make_skill(hardware="cpu", dtype="float32", regime="memory-bound", shape=(2, 16, 64)))
        store.upsert(make_skill(hardware="nvidia-l4"))
        store.upsert(make_skill(op="silu_mul", shape=(1, 1, 8960)))
        query = Fingerprint.from_target(
            {"op": "rms_norm", "regime": "launch-bound", "shapes": [[1, 1, 1536]], "dtype": "bfloat16"}, "nvidia-h200"
        )
        hits = store.retrieve(query, "rms_norm", "nvidia-h200", limit=8)
    assert sorted(h.id for h in hits) == sorted(h200)
    assert all(h.match == "exact" and h.op == "rms_norm" and h.hardware == "nvidia-h200" for h in hits)
    assert all(h.score > 0.99 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_retrieval_keeps_to_the_hardware_kind(qdrant_dir):
    """Skills are filed with their device's kind: two H100 80GB names share one, an H100 PCIe and an
    L4 are others; a family with no skill on the kind transfers from the same kind first."""
    with SkillStore(path=qdrant_dir) as store:
        sxm = store.upsert(make_skill(hardware="NVIDIA H100 80GB HBM3"))
        store.upsert(make_skill(hardware="NVIDIA H100 PCIe", variant="pcie"))
        l4_silu = store.upsert(make_skill(op="silu_mul", hardware="nvidia-l4", shape=(1, 1, 8960)))
        query = Fingerprint.from_target({"op": "rms_norm", "shapes": [[1, 1, 1536]], "dtype": "bfloat16"}, "x")
        exact = store.retrieve(query, "rms_norm", "NVIDIA H100-SXM5-80GB", limit=8)
        assert store.get(sxm).hardware_kind == "nvidia-h100-80gb"
        assert [(h.id, h.match) for h in exact] == [(sxm, "exact")]
        transfer = store.retrieve(query, "layer_norm", "nvidia-h100-pcie", limit=8)
        assert [h.hardware for h in transfer] == ["NVIDIA H100 PCIe"] and transfer[0].match == "transfer"
        anywhere = store.retrieve(query, "silu_mul", "nvidia-h200", limit=8)  # nothing on the kind at all
        assert l4_silu in {h.id for h in anywhere} and all(h.match == "transfer" for h in anywhere)


def test_layer_norm_retrieves_rms_norm_skills_by_nearest_fingerprint(qdrant_dir):
    """Transfer: only RMSNorm skills stored; a GPT-2-style LayerNorm target finds them."""
    with SkillStore(path=qdrant_dir) as store:
        ids = {store.upsert(make_skill(variant=v, shape=(1, 1, h))) for v, h in (("a", 1536), ("b", 2048), ("c", 896))}
        layer_norm = Fingerprint.from_target(
            {"op": "layer_norm", "regime": "launch-bound", "shapes": [[1, 1, 768]], "dtype": "bfloat16"}, "nvidia-h200"
        )
        hits = store.retrieve(layer_norm, "layer_norm", "nvidia-h200", limit=8)
        assert {h.id for h in hits} == ids
        assert all(h.match == "transfer" and h.op == "rms_norm" for h in hits)
        assert min(h.score for h in hits) > 0.9

        # With an activation kernel in the library too, the norms still come first.
        silu = store.upsert(make_skill(op="silu_mul", shape=(1, 1, 8960)))
        hits = store.retrieve(layer_norm, "layer_norm", "nvidia-h200", limit=8)
    assert [h.op for h in hits[:3]] == ["rms_norm"] * 3
    assert hits[-1].id == silu and hits[-1].score < hits[2].score - 0.2


def test_served_rollbacks_are_kept_per_model_and_survive_learning_the_kernel_again(qdrant_dir):
    with SkillStore(path=qdrant_dir) as store:
        first = store.upsert(make_skill())
        store.record_served_rollback(first, {"model": "m1", "campaign": "wf-1", "reason": "batch 8 3% slower"})
        store.record_served_rollback(first, {"model": "m2", "campaign": "wf-2", "reason": "batch 1 5% slower"})
        assert store.upsert(make_skill(reward=2)) == first  # learned again by a later campaign
        assert [r["campaign"] for r in store.served_rollbacks(first, "m1")] == ["wf-1"]
        assert store.served_rollbacks(first, "m3") == [] and store.served_rollbacks("no-such-skill", "m1") == []
        with pytest.raises(KeyError):
            store.record_served_rollback("no-such-skill", {"model": "m1"})
    reopened = SkillStore(path=qdrant_dir).get(first)
    assert [r["model"] for r in reopened.served_rollbacks] == ["m1", "m2"] and reopened.served_rollbacks[0]["at"]


def test_bandit_statistics_survive_process_restarts(qdrant_dir):
    with SkillStore(path=qdrant_dir) as store:
        a = store.upsert(make_skill(variant="a"))
        b = store.upsert(make_skill(variant="b"))
    ids = sorted([a, b])
    choose = textwrap.dedent(f"""
        from gpuyantra.skills import Fingerprint, SkillStore, ucb1_choose
        fp = Fingerprint.from_target({{"op": "rms_norm", "regime": "launch-bound", "shapes": [[1, 1, 1536]],
                                      "dtype": "bfloat16"}}, "nvidia-h200")
        store = SkillStore(path={str(qdrant_dir)!r})
        pick = ucb1_choose(store.retrieve(fp, "rms_norm", "nvidia-h200"))
        reward = {{{a!r}: 3.0, {b!r}: -1.0}}[pick.id]
        print(pick.id, store.record_outcome(pick.id, reward).pulls)
    """)
    picks = []
    for _ in range(4):  # each round is a fresh process: statistics come from the store alone
        out = run_python(choose).stdout.split()
        picks.append(out[0])
    # Unpulled skills first in id order, then UCB1 exploits the good one.
    assert picks[:2] == ids
    assert picks[2:] == [a, a]
    final = {s.id: s for s in SkillStore(path=qdrant_dir).list()}
    assert (final[a].pulls, final[a].total_reward) == (3, 9.0)
    assert (final[b].pulls, final[b].total_reward, final[b].last_reward) == (1, -1.0, -1.0)
    assert final[a].mean_reward == 3.0
    assert ucb1_choose(list(final.values())).id == a


def test_two_processes_take_turns_on_the_folder(qdrant_dir):
    SkillStore(path=qdrant_dir).upsert(make_skill(variant="a"))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from gpuyantra.skills import SkillStore
            with SkillStore(path={str(qdrant_dir)!r}) as store:
                print("holding", store.count(), flush=True)
                time.sleep(1.5)
        """),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().startswith("holding")
        started = time.monotonic()
        sid = SkillStore(path=qdrant_dir, lock_timeout=60).upsert(make_skill(variant="b"))
        waited = time.monotonic() - started
    finally:
        holder.wait(timeout=60)
    assert holder.returncode == 0
    assert waited > 0.3  # it waited for the other process instead of failing
    assert SkillStore(path=qdrant_dir).get(sid) is not None


def test_same_thread_second_open_fails_fast(qdrant_dir):
    with SkillStore(path=qdrant_dir):
        with pytest.raises(RuntimeError, match="already open in this thread"):
            SkillStore(path=qdrant_dir).count()
    assert SkillStore(path=qdrant_dir).count() == 0


def test_export_import_round_trip(qdrant_dir, tmp_path):
    with SkillStore(path=qdrant_dir) as store:
        ids = [store.upsert(make_skill(variant=v)) for v in ("a", "b")]
        store.upsert(make_skill(op="silu_mul", shape=(1, 1, 8960)))
        store.record_outcome(ids[0], 2)
        store.record_outcome(ids[0], 3)
        before = [s.to_dict() for s in store.list()]
        path = tmp_path / "lib.jsonl"
        assert store.export_jsonl(path) == 3
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 3 and all("source" in line and "pulls" in line for line in lines)

    other = SkillStore(path=tmp_path / "other-machine")
    assert other.import_jsonl(path) == 3
    after = [s.to_dict() for s in other.list()]
    assert after == before
    # Importing again changes nothing; the vectors were rebuilt, so retrieval works there.
    assert other.import_jsonl(path) == 3
    assert other.count() == 3
    fp = Fingerprint.from_payload(before[0]["fingerprint"])
    assert {h.id for h in other.retrieve(fp, "rms_norm", "nvidia-h200")} == set(ids)
    # Local pulls newer than the file's are not rolled back by an import.
    other.record_outcome(ids[0], 3)
    other.import_jsonl(path)
    assert other.get(ids[0]).pulls == 3


def test_cli_list_show_export_import(qdrant_dir, tmp_path):
    with SkillStore(path=qdrant_dir) as store:
        sid = store.upsert(make_skill(variant="a"))
        store.upsert(make_skill(op="silu_mul", shape=(1, 1, 8960)))
    env = {"GPUYANTRA_QDRANT_PATH": str(qdrant_dir), "GPUYANTRA_STATE_DIR": str(tmp_path / "state")}

    listed = run_cli("skills", "list", env_extra=env)
    assert listed.returncode == 0, listed.stderr
    assert sid in listed.stdout and "silu_mul" in listed.stdout

    shown = run_cli("skills", "show", sid[:8], env_extra=env)
    assert shown.returncode == 0, shown.stderr
    assert "def entry" in shown.stdout and '"op": "rms_norm"' in shown.stdout
    assert run_cli("skills", "show", "no-such-id", env_extra=env).returncode == 1

    out = tmp_path / "lib.jsonl"
    exported = run_cli("skills", "export", str(out), env_extra=env)
    assert exported.returncode == 0 and "exported 2" in exported.stdout
    target = tmp_path / "imported"
    imported = run_cli("skills", "import", str(out), "--qdrant-path", str(target), env_extra=env)
    assert imported.returncode == 0 and "imported 2" in imported.stdout, imported.stderr
    as_json = run_cli("skills", "list", "--json", "--op", "rms_norm", "--qdrant-path", str(target), env_extra=env)
    rows = json.loads(as_json.stdout)
    assert [r["id"] for r in rows] == [sid] and "source" not in rows[0]
    assert run_cli("skills", "import", str(tmp_path / "missing.jsonl"), env_extra=env).returncode == 1
