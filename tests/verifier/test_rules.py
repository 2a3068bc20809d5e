"""The rule table: the code, docs/verifier.md and the adversarial suite name the same rules."""

from __future__ import annotations

import re
from pathlib import Path

from gpuyantra.verifier.rules import RULES
from gpuyantra.verifier.verdict import LAYERS

ROOT = Path(__file__).parents[2]


def test_every_rule_has_a_known_layer():
    assert {rule.layer for rule in RULES.values()} == set(LAYERS)


def test_docs_table_matches_the_code():
    text = (ROOT / "docs" / "verifier.md").read_text().split("\n## Rules\n")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (\w+) \|", text, flags=re.M)
    assert dict(rows) == {name: rule.layer for name, rule in RULES.items()}


def test_every_rule_name_appears_in_the_tests():
    """A rule nobody exercises is a rule nobody knows works (GPU-only rules are in gpu tests)."""
    text = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py") if p.name != "test_rules.py")
    missing = [name for name in RULES if f'"{name}"' not in text]
    assert missing == []
