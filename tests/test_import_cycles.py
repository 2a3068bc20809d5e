"""Import cycles among the gpuyantra/ and serving/ modules: the module import graph, built with `ast`
(every import, function-level ones included; `if TYPE_CHECKING:` imports excluded), and its strongly
connected components. Only the known ones below may remain. The swap engine and the serving
engine's parts may not import each other even for type annotations (`if TYPE_CHECKING:` counted),
and no class there inherits from more than one project class (the binders and the serving parts
are composed, not stacked). A module over 600 lines gives the reason on its first line. The library
(`gpuyantra/`) and the serving process (`serving/`) import nothing of the app (`workflows/`,
`activities/`, `workers/`): arrows run from the app down to the library, never up.

`python -m tests.test_import_cycles` prints every cycle with its edges."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("gpuyantra", "serving")
APP_PACKAGES = ("workflows", "activities", "workers")
# The one arrow up that stays: the CLI's `gpuyantra worker` is the command that starts the app's workers.
ENTRY_POINTS = {("gpuyantra.commands.worker", "workers.main")}
# Packages whose cycles are known and kept (none left).
ALLOWED: tuple[str, ...] = ()


def module_files(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    out = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


# Packages and modules held to no cycle even through `if TYPE_CHECKING:` imports.
TYPED_ACYCLIC = ("gpuyantra.swap", "serving")


def import_graph(type_checking: bool = False, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (`from a import b`: a, and a.b when b is a module);
    `type_checking`: imports under `if TYPE_CHECKING:` count too."""
    modules = module_files(packages)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def edges(name: str, path: Path) -> set[str]:
        out: set[str] = set()
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        stack: list[ast.AST] = [ast.parse(path.read_text())]
        while stack:
            node = stack.pop()
            if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                stack.extend(node.orelse)
                continue
            if isinstance(node, ast.Import):
                out.update(m for a in node.names if (m := known(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                if target := known(base):
                    out.add(target)
                out.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules)
            stack.extend(ast.iter_child_nodes(node))
        out.discard(name)
        return out

    return {name: edges(name, path) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def allowed(component: list[str]) -> bool:
    return any(all(m == p or m.startswith(p + ".") for m in component) for p in ALLOWED)


def test_no_new_import_cycles():
    unexpected = [c for c in cycles(import_graph()) if not allowed(c)]
    assert unexpected == [], f"import cycles: {unexpected}"


def library_to_app_arrows(graph: dict[str, set[str]]) -> list[str]:
    """`library.module -> app.module` for every import the library makes of the app."""
    library = {name for name in graph if name.split(".")[0] in PACKAGES}
    return sorted(
        f"{name} -> {target}"
        for name in library
        for target in graph[name]
        if target.split(".")[0] in APP_PACKAGES and (name, target) not in ENTRY_POINTS
    )


def test_the_library_imports_nothing_of_the_app():
    assert library_to_app_arrows(import_graph(packages=PACKAGES + APP_PACKAGES)) == []


def test_an_arrow_from_the_library_to_the_app_is_found():
    # The check itself: a made-up graph with one upward arrow names it.
    graph = {"gpuyantra.cli": {"workflows.campaign", "gpuyantra.config"}, "workflows.campaign": {"gpuyantra.config"}}
    assert library_to_app_arrows(graph) == ["gpuyantra.cli -> workflows.campaign"]


def test_the_workflows_and_the_activities_they_call_import_no_torch():
    # The workflows import the activity modules (passed through the sandbox) to call activities by
    # reference: those modules must leave torch to the activities' bodies. A fresh interpreter, since
    # this one has imported torch long ago.
    code = (
        "import sys, workflows.campaign, workflows.verify; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'triton', 'transformers', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_swap_and_serving_modules_have_no_cycles_even_for_types():
    graph = import_graph(type_checking=True)
    inside = [c for c in cycles(graph) if all(m.startswith(TYPED_ACYCLIC) for m in c)]
    assert inside == [], f"import cycles through type-checking imports: {inside}"


def project_class_names() -> set[str]:
    return {
        node.name
        for path in module_files().values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }


def test_no_class_in_swap_or_serving_stacks_two_project_classes():
    project = project_class_names()
    stacked = []
    for name, path in module_files().items():
        if not name.startswith(TYPED_ACYCLIC):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                if len([b for b in bases if b in project]) > 1:
                    stacked.append(f"{name}.{node.name}({', '.join(bases)})")
    assert stacked == [], f"classes inheriting from several project classes: {stacked}"


LONG_MODULE_LINES = 600
SOURCE_FOLDERS = ("gpuyantra", "serving", "workflows", "activities", "workers", "benchmarks", "tests")


def test_no_long_module_without_a_reason_at_its_top():
    """A module over LONG_MODULE_LINES lines says why in its first lines (`# Over 600 lines: ...`)."""
    unexplained = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = path.read_text().splitlines()
            if len(lines) > LONG_MODULE_LINES and not any(ln.startswith("# Over 600 lines: ") for ln in lines[:2]):
                unexplained.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert unexplained == [], f"split these or give the reason on their first line: {unexplained}"


if __name__ == "__main__":
    graph = import_graph()
    for component in cycles(graph):
        print(("known " if allowed(component) else "NEW   ") + " <-> ".join(component))
        for name in component:
            print(f"    {name} -> {', '.join(sorted(graph[name] & set(component)))}")
