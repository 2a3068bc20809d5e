"""The module class's part of the contract, kept in the state folder between processes
(gpuyantra/verifier/module_contracts.py): a kept check skips importing the class, and anything it
depends on (the class's file, the ADAPTER) makes a new check."""

from __future__ import annotations

import json
import os
import sys

import pytest

from gpuyantra.verifier.contract import check_contract
from gpuyantra.verifier.module_contracts import CONTRACTS_FILE
from gpuyantra.verifier.static import check_source
from tests.verifier.conftest import HEADER, HONEST_ENTRY

CLASS = "gy_kept_norms.norm.Norm"
NORM_SOURCE = """import torch


class Norm(torch.nn.Module):
    def __init__(self, hidden_size=64, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.{attr} = eps

    def forward(self, x):
        return x
"""


@pytest.fixture
def norm_package(tmp_path, monkeypatch, state):
    """A module class in a package of its own on sys.path; writes its file with the epsilon named
    as asked, forgetting the imported module (as a new process would)."""
    package = tmp_path / "pkg" / "gy_kept_norms"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))

    def write(attr: str) -> None:
        path = package / "norm.py"
        existed = path.exists()
        path.write_text(NORM_SOURCE.format(attr=attr))
        if existed:  # a later edit: its modification time moves on even within the clock's resolution
            stat = path.stat()
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        forget()

    yield write
    forget()


def forget() -> None:
    for name in ("gy_kept_norms.norm", "gy_kept_norms"):
        sys.modules.pop(name, None)


def check(adapter_source: str = HEADER):
    return check_contract(check_source(adapter_source + HONEST_ENTRY), CLASS)


def kept_entries(state) -> dict:
    path = state / "verifier" / CONTRACTS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_kept_check_does_not_import_the_class(norm_package, state):
    norm_package("variance_epsilon")
    first = check()
    assert first.failures == []
    assert "gy_kept_norms.norm" in sys.modules
    assert len(kept_entries(state)) == 1
    forget()
    again = check()
    assert again.failures == []
    assert again.param_specs == first.param_specs
    assert again.module_class == CLASS
    assert "gy_kept_norms.norm" not in sys.modules  # answered from the state folder


def test_an_edit_of_the_class_file_is_checked_again(norm_package, state):
    norm_package("variance_epsilon")
    assert check().failures == []
    norm_package("epsilon")  # the binding's attribute is gone
    rules = {f.rule for f in check().failures}
    assert rules == {"adapter-attr"}
    assert "gy_kept_norms.norm" in sys.modules  # imported again, not answered from the kept check


def test_another_adapter_is_checked_again_and_failures_are_not_kept(norm_package, state):
    norm_package("variance_epsilon")
    assert check().failures == []
    bad = HEADER.replace(
        '    {"kernel_param": "eps", "module_attr": "variance_epsilon"},\n',
        '    {"kernel_param": "eps", "module_attr": "epsilon"},\n',
    )
    assert bad != HEADER
    assert {f.rule for f in check(bad).failures} == {"adapter-attr"}
    assert len(kept_entries(state)) == 1  # only the passing check


def test_a_kept_check_is_not_taken_for_a_failing_candidate(norm_package, state):
    """Earlier failures (here a kernel parameter bound twice) still get the module class's own
    findings, as without the kept check."""
    norm_package("variance_epsilon")
    assert check().failures == []
    doubled = HEADER.replace(
        '    {"kernel_param": "eps", "module_attr": "variance_epsilon"},\n',
        '    {"kernel_param": "eps", "module_attr": "variance_epsilon"},\n'
        '    {"kernel_param": "eps", "module_attr": "missing_attr"},\n',
    )
    rules = {f.rule for f in check(doubled).failures}
    assert {"adapter-params", "adapter-attr"} <= rules
