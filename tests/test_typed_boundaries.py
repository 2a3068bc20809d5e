"""What crosses a Temporal boundary is a typed record: no activity takes or returns, and no workflow
returns or answers a query with, a bare `dict[str, Any]`, `dict` or `Any` (read from the source with
`ast`, nothing imported). The records live in gpuyantra/campaign/ (`records.py`, `results.py`); a
free-form part keeps a named alias there."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[1]
UNTYPED = {"dict[str, Any]", "dict", "Any", "Mapping[str, Any]", "dict[str, Any] | None"}


def decorated(tree: ast.Module, decorators: set[str]) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions and methods of `tree` under one of `decorators` (`activity.defn`, called or not)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
            if names & decorators:
                yield node


def untyped_annotations(folders: tuple[str, ...], decorators: set[str], with_parameters: bool) -> list[str]:
    found = []
    for path in sorted(path for folder in folders for path in (ROOT / folder).glob("*.py")):
        for fn in decorated(ast.parse(path.read_text()), decorators):
            annotated = [("return", fn.returns)]
            if with_parameters:
                annotated += [(arg.arg, arg.annotation) for arg in fn.args.args if arg.arg != "self"]
            for name, annotation in annotated:
                text = ast.unparse(annotation) if annotation is not None else "no annotation"
                if text in UNTYPED or text == "no annotation":
                    found.append(f"{path.name}:{fn.lineno} {fn.name} {name}: {text}")
    return found


def test_activities_take_and_return_typed_records() -> None:
    found = untyped_annotations(("activities", "workers"), {"activity.defn"}, with_parameters=True)
    assert not found, "activities with an untyped input or result:\n" + "\n".join(found)


def test_workflows_return_and_answer_typed_records() -> None:
    # A workflow's input stays raw JSON (`*args: Any`, checked by gpuyantra/campaign/inputs.py): only results.
    found = untyped_annotations(("workflows",), {"workflow.run", "workflow.query"}, with_parameters=False)
    assert not found, "workflow results or queries typed as a bare dict:\n" + "\n".join(found)


def test_the_scan_finds_an_untyped_activity() -> None:
    """The scan itself: an activity returning `dict[str, Any]` is found (else the tests above prove nothing)."""
    source = "@activity.defn(name='x')\ndef x(request: dict) -> dict[str, Any]:\n    return {}\n"
    functions = list(decorated(ast.parse(source), {"activity.defn"}))
    assert [ast.unparse(fn.returns) for fn in functions if fn.returns] == ["dict[str, Any]"]
