"""Op-family tests run the template kernels in Triton's interpreter on the CPU.

TRITON_INTERPRET must be set before triton is first imported, hence at conftest import time.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pathlib

import pytest
import torch

from gpuyantra.authors.template import default_strategy, render
from gpuyantra.candidate import load_candidate


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def load_rendered(tmp_path: pathlib.Path):
    """load_rendered(op, strategy=None, adapter=None) -> Candidate loaded from a real file."""
    counter = {"n": 0}

    def load(op: str, strategy: dict | None = None, adapter: list | None = None):
        from gpuyantra.ops import get_op
        from gpuyantra.ops.base import import_class

        if adapter is None:
            family = get_op(op)
            adapter = family.default_adapter(import_class(family.default_module)) if family.params else []
        counter["n"] += 1
        path = tmp_path / f"{op}_{counter['n']}.py"
        path.write_text(render(op, strategy if strategy is not None else default_strategy(op), adapter))
        return load_candidate(path)

    return load
