"""`skills import` accepts only records of the store's shape (gpuyantra/skills/schema.py), naming the bad
line; a bad record already in the store is skipped with a warning by `list`, `get` and `retrieve`."""

from __future__ import annotations

import json
import logging

import pytest

from gpuyantra.cli import main
from gpuyantra.skills import Fingerprint, SkillStore
from gpuyantra.skills.schema import InvalidSkillRecord
from tests.skills.conftest import make_skill

BAD_FIELDS = [
    ("reward", "high", "field 'reward' must be a number, got \"high\""),
    ("pulls", -3, "field 'pulls' must be a whole number of at least 0, got -3"),
    ("fingerprint", {"regime": "x"}, "field 'fingerprint' is not a fingerprint"),
    ("shapes", "1x1536", "field 'shapes' must be a list of lists of integers"),
    ("source", 7, "field 'source' must be a string, got 7"),
    ("speedup_vs_eager", True, "field 'speedup_vs_eager' must be a number or null, got true"),
]


def export_lines(tmp_path, bad: dict | None = None) -> str:
    """A two-line export: a good skill, then (when `bad` is given) a second one with those fields."""
    second = {**make_skill(variant="b").to_dict(), **(bad or {})}
    path = tmp_path / "skills.jsonl"
    path.write_text(json.dumps(make_skill().to_dict()) + "\n" + json.dumps(second) + "\n")
    return str(path)


@pytest.mark.parametrize("field, value, message", BAD_FIELDS, ids=[f[0] for f in BAD_FIELDS])
def test_import_names_the_bad_line_and_imports_nothing(qdrant_dir, tmp_path, field, value, message):
    path = export_lines(tmp_path, {field: value})
    with SkillStore(path=qdrant_dir) as store:
        with pytest.raises(InvalidSkillRecord) as refused:
            store.import_jsonl(path)
        assert str(refused.value).startswith(f"{path}:2: ") and message in str(refused.value)
        assert store.count() == 0


def test_skills_import_exits_2_with_one_line(qdrant_dir, tmp_path, capsys):
    path = export_lines(tmp_path, {"reward": "high"})
    assert main(["skills", "import", path, "--qdrant-path", str(qdrant_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpuyantra skills: import {path}:2: field 'reward' must be a number, got \"high\""


def store_with_a_bad_record(qdrant_dir) -> tuple[SkillStore, str]:
    """A store holding two good skills and one whose payload was written with wrong types."""
    store = SkillStore(path=qdrant_dir)
    store.upsert(make_skill(variant="a"))
    store.upsert(make_skill(variant="c"))
    bad_id = store.upsert(make_skill(variant="b"))
    with store._session() as client:  # what an unchecked import used to store
        client.set_payload(store.collection, {"reward": "high", "fingerprint": "x"}, points=[bad_id], wait=True)
    return store, bad_id


def test_a_bad_record_in_the_store_is_skipped_with_a_warning(qdrant_dir, caplog):
    store, bad_id = store_with_a_bad_record(qdrant_dir)
    with store, caplog.at_level(logging.WARNING, logger="gpuyantra.skills"):
        assert len(store.list()) == 2 and bad_id not in [s.id for s in store.list()]
        assert store.get(bad_id) is None
        fingerprint = Fingerprint.from_payload(make_skill().fingerprint)
        seeds = store.retrieve(fingerprint, "rms_norm", "nvidia-h200")  # a campaign's seed retrieval
        assert len(seeds) == 2 and bad_id not in [s.id for s in seeds]
    assert f"skipping skill {bad_id}, a bad record: field 'reward' must be a number" in caplog.text


def test_skills_list_still_works_with_a_bad_record(qdrant_dir, capsys):
    store, bad_id = store_with_a_bad_record(qdrant_dir)
    store.close()
    assert main(["skills", "list", "--qdrant-path", str(qdrant_dir)]) == 0
    assert main(["skills", "list", "--json", "--qdrant-path", str(qdrant_dir)]) == 0
    assert bad_id not in capsys.readouterr().out
