"""`check_source`: parse the candidate, then run the static rules in order.

`_Checker` combines the rule mixins over the shared state in `base._CheckerBase`; `run` is the one
place that says in which order the steps happen (later steps read what earlier ones recorded).
"""

from __future__ import annotations

import ast
from typing import Any

from gpuyantra.candidate import encoding_problem
from gpuyantra.verifier.static.launches import _LaunchRules
from gpuyantra.verifier.static.module_level import _ModuleLevel
from gpuyantra.verifier.static.nodes import _NodeRules
from gpuyantra.verifier.static.report import LAYER, StaticReport
from gpuyantra.verifier.static.scopes import _is_main_guard
from gpuyantra.verifier.static.taint import _TaintRules
from gpuyantra.verifier.verdict import Failure


def check_source(source: str, filename: str = "<candidate>", family: Any = None) -> StaticReport:
    """Run every static rule on `source`; `family` (an OpFamily) types entry's parameters when known."""
    report = StaticReport()
    # The checker reads strict UTF-8; a file Python (or Triton's source lookup) would decode otherwise
    # could hide code from it (a raw_unicode_escape declaration turns `\\u000a` into a line break).
    problem = encoding_problem(source.encode("utf-8", "surrogatepass"))
    if problem:  # the other rules still run (and the loader refuses the file too)
        report.failures.append(Failure(LAYER, "source-encoding", problem))
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        report.failures.append(Failure(LAYER, "syntax-error", f"line {exc.lineno}: {exc.msg}"))
        return report
    except (ValueError, RecursionError) as exc:  # null bytes, absurd nesting
        report.failures.append(Failure(LAYER, "syntax-error", str(exc)))
        return report
    report.parsed = True
    try:
        _Checker(tree, report, family).run()
    except RecursionError:
        report.failures.append(Failure(LAYER, "syntax-error", "the file nests too deeply to analyse"))
    return report


class _Checker(_ModuleLevel, _NodeRules, _TaintRules, _LaunchRules):
    """Every rule mixin over one shared state; `run` is the order of the steps."""

    def run(self) -> None:
        self.tree.body = [stmt for stmt in self.tree.body if not _is_main_guard(stmt)]
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
        self._collect_imports()
        self._module_level()
        self._visit(self.tree, "module", None, annotation=False)
        # Host dataflow: the launch fixpoint says which helpers return fresh or kernel-written
        # buffers, which the tensor taint reads.
        self._seed_taint()
        self._launch_fixpoint()
        self._propagate_taint()
        self._operator_rules()
        self._launch_rules()
        self.report.kernels = sorted(self.kernels)
