"""Check what users hand the workflows: a campaign's JSON input and its signals' arguments, a verification's input.

Plain Python, stdlib only: it runs inside the workflow sandbox. A bad input must fail the workflow
run at once with a message naming the field; decoding it into CampaignInput inside the SDK would
instead fail the workflow *task*, which Temporal retries forever.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from gpuyantra.campaign.records import CampaignInput, VerifyFileInput
from gpuyantra.rewards import REWARD_MAX, REWARD_MIN  # stdlib only

T = TypeVar("T")

# Inclusive bounds of the numeric fields: min_reward spans the verifier's reward ladder; the upper
# bounds keep a typo ("max_iterations": 600) from holding a GPU for days.
RANGES: dict[str, tuple[int, int]] = {
    "min_reward": (REWARD_MIN, REWARD_MAX),
    "max_iterations": (1, 100),
    "max_targets": (1, 100),
}
DEVICES = ("cpu", "cuda")
EXAMPLE = '{"server_url": "http://127.0.0.1:8000"}'
VERIFY_EXAMPLE = '{"source": "OP = ...", "file_name": "rms_norm.py"}'
MAX_VERIFY_TIMEOUT_S = 3600  # a verdict's sandbox limit; beyond it a typo holds a GPU slot
LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


class InvalidInput(ValueError):
    """The campaign input is malformed; the message names every bad field."""


def parse_campaign_input(args: tuple[Any, ...]) -> CampaignInput:
    """The workflow's decoded arguments (JSON values) as a checked CampaignInput, or InvalidInput."""
    return _parse(args, CampaignInput, "campaign", EXAMPLE, _check_value)


def parse_verify_input(args: tuple[Any, ...]) -> VerifyFileInput:
    """VerifyKernel's decoded arguments as a checked VerifyFileInput, or InvalidInput."""
    request = _parse(args, VerifyFileInput, "verify", VERIFY_EXAMPLE, _check_verify_value)
    if request.problem_source is not None and request.module_class is not None:
        raise InvalidInput(
            "invalid verify input: fields 'problem_source' and 'module_class' both name the target: give one"
        )
    return request


def _parse(args: tuple[Any, ...], cls: type[T], what: str, example: str, check: Callable[[str, Any], list[str]]) -> T:
    if len(args) != 1 or not isinstance(args[0], dict):
        got = "no input" if not args else f"{len(args)} inputs" if len(args) > 1 else _kind(args[0])
        raise InvalidInput(f"invalid {what} input: expected one JSON object like {example}, got {got}")
    raw: dict[str, Any] = args[0]
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    problems: list[str] = []
    for name in raw:
        if name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1, cutoff=0.5)
            problems.append(f"unknown field {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    for name, spec in fields.items():
        if name not in raw:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                problems.append(f"missing required field {name!r}")
        elif not _matches(raw[name], hints[name]):
            problems.append(f"field {name!r} must be {_describe(hints[name])}, got {_show(raw[name])}")
        else:
            problems.extend(check(name, raw[name]))
    if problems:
        raise InvalidInput(f"invalid {what} input: " + "; ".join(problems))
    return cls(**{name: raw[name] for name in fields if name in raw})


def _check_verify_value(name: str, value: Any) -> list[str]:
    """Checks beyond the type, as `gpuyantra verify`'s own options check them."""
    if value is None:
        return []
    if name == "source" and not value.strip():
        return ["field 'source' must hold the candidate's Python source, got an empty string"]
    if name == "problem_source" and not value.strip():
        return ["field 'problem_source' must hold a KernelBench problem's Python source, got an empty string"]
    if name == "device" and value not in DEVICES:
        return [f"field 'device' must be one of {', '.join(DEVICES)} or null, got {_show(value)}"]
    if name == "shapes" and (not value or any(not shape or min(shape) < 1 for shape in value)):
        return [f"field 'shapes' must be lists of positive sizes like [[1, 2048]], got {_show(value)}"]
    if name == "timeout" and not 0 < value <= MAX_VERIFY_TIMEOUT_S:
        return [f"field 'timeout' must be seconds in (0, {MAX_VERIFY_TIMEOUT_S}], got {_show(value)}"]
    if name == "param_shapes":
        bad = [k for k, v in value.items() if v is not None and not (_matches(v, list[int]) and v and min(v) >= 1)]
        if bad:
            return [f"field 'param_shapes' must map names to positive sizes or null, got {_show(value)}"]
    return []


def _check_value(name: str, value: Any) -> list[str]:
    """Checks beyond the type: ranges, the URL's shape, names."""
    if name in RANGES and value is not None:
        low, high = RANGES[name]
        if not low <= value <= high:
            return [f"field {name!r} must be between {low} and {high}, got {value}"]
    if name == "server_url":
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return [f"field 'server_url' must be an http:// or https:// URL with a host, got {_show(value)}"]
    if name == "device" and value is not None and value not in DEVICES:
        return [f"field 'device' must be one of {', '.join(DEVICES)} or null, got {_show(value)}"]
    if name == "ops" and value is not None and not all(op.strip() for op in value):
        return [f"field 'ops' must hold op names, got {_show(value)}"]
    return []


def signal_op(signal: str, args: tuple[Any, ...]) -> tuple[str | None, str | None]:
    """(op, None) for a well-formed `approve`/`reject` argument list, else (None, notice).

    No argument means every op ("*"): `temporal workflow signal --name approve` needs no input."""
    if not args:
        return "*", None
    if len(args) == 1 and isinstance(args[0], str) and args[0].strip():
        return args[0].strip(), None
    shown = ", ".join(_show(a) for a in args)
    return None, f'{signal} ignored: expected no argument or one op name such as "rms_norm" or "*", got {shown}'


def server_key(url: str) -> str:
    """One spelling per server, so `http://localhost:8000/` and `http://127.0.0.1:8000` compare equal."""
    parts = urlsplit(url.strip())
    scheme = (parts.scheme or "http").lower()
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host in LOOPBACK or host.startswith("127.") else host
    port: int | str
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:  # a port out of range: keep the text, it names no live server anyway
        port = parts.netloc.rsplit(":", 1)[-1]
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if hint is type(None):
        return value is None
    if hint is int:  # JSON true/false are bools, and Python's bool is an int
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # JSON has one number type: 300 is a float here
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is Any:
        return True
    return isinstance(value, origin or hint)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    if origin is list:
        return f"a list of {_describe(typing.get_args(hint)[0]).split(' ', 1)[1]}s"
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        type(None): "null",
        dict: "an object",
    }
    return names.get(origin or hint, f"a {getattr(hint, '__name__', hint)}")


def _kind(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "a list", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, list, dict, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
