"""The stored shape of a skill: what `import_jsonl` accepts and what the store's readers trust.

A record is checked field by field against `Skill`'s types (a number where a number is declared, never
a string or a boolean; lists and objects of the declared items) plus what the library needs to use it:
an op and a source, and a fingerprint a vector can be made of. `import_jsonl` refuses a file with one
bad record (naming its line) before writing anything; `list`, `get` and `retrieve` skip a bad record
already in the store with a warning, so one record never breaks the library.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("gpuyantra.skills")

Check = Callable[[Any], bool]


class InvalidSkillRecord(ValueError):
    """A skill record that does not have the store's shape; the message names the field."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional_number(value: Any) -> bool:
    return value is None or _number(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _list_of(item: Check) -> Check:
    return lambda value: isinstance(value, list) and all(item(v) for v in value)


def _text_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _shape(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in value)


# Each stored field, its check and how to say what it must be.
FIELDS: dict[str, tuple[Check, str]] = {
    "id": (_text, "a string"),
    "op": (_text, "a string"),
    "hardware": (_text, "a string"),
    "hardware_kind": (_text, "a string"),
    "source": (_text, "a string"),
    "adapter": (_list_of(_text_map), "a list of objects of strings"),
    "strategy": (_object, "an object"),
    "reward": (_number, "a number"),
    "speedup_vs_eager": (_optional_number, "a number or null"),
    "speedup_vs_compile": (_optional_number, "a number or null"),
    "shapes": (_list_of(_shape), "a list of lists of integers"),
    "dtypes": (_list_of(_text), "a list of strings"),
    "fingerprint": (_object, "an object"),
    "provenance": (_object, "an object"),
    "versions": (_text_map, "an object of strings"),
    "pulls": (_count, "a whole number of at least 0"),
    "total_reward": (_number, "a number"),
    "created_at": (_text, "a string"),
    "module_class": (_text, "a string"),
    "source_digest": (_text, "a string"),
    "updated_at": (_text, "a string"),
    "last_reward": (_optional_number, "a number or null"),
    "notes": (_text, "a string"),
    "served_rollbacks": (_list_of(_object), "a list of objects"),
}
REQUIRED = ("op", "source")


def problems(record: Any) -> list[str]:
    """What is wrong with one record (a JSON value) as a stored skill; [] when nothing is."""
    if not isinstance(record, Mapping):
        return [f"a skill is a JSON object, got {_show(record)}"]
    found = [f"missing field {name!r}" for name in REQUIRED if not record.get(name)]
    for name, (check, must_be) in FIELDS.items():
        if name in record and not check(record[name]):
            found.append(f"field {name!r} must be {must_be}, got {_show(record[name])}")
    if not found and record.get("fingerprint"):
        found += _fingerprint_problems(record["fingerprint"])
    return found


def _fingerprint_problems(payload: Mapping[str, Any]) -> list[str]:
    from gpuyantra.skills.fingerprint import Fingerprint

    try:
        vector = Fingerprint.from_payload(payload).vector
    except (KeyError, TypeError, ValueError) as exc:
        return [f"field 'fingerprint' is not a fingerprint: {type(exc).__name__}: {exc}"]
    return [] if all(math.isfinite(x) for x in vector) else ["field 'fingerprint' makes a vector that is not finite"]


def check(record: Any, where: str) -> None:
    """InvalidSkillRecord `where: problem; problem` unless `record` has the store's shape."""
    found = problems(record)
    if found:
        raise InvalidSkillRecord(f"{where}: " + "; ".join(found))


def usable(payload: Mapping[str, Any] | None, point_id: Any) -> bool:
    """Whether a stored payload can be read as a skill; a warning names a bad one (skipped by readers)."""
    found = problems(payload or {})
    if found:
        log.warning("skill library: skipping skill %s, a bad record: %s", point_id, "; ".join(found))
    return not found


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
