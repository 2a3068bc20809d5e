"""Model code is imported by one thread at a time: a GPU worker imports the model library in the
background at its start while a verdict's contract imports a model's module; two threads importing
modules of one library with import cycles can each be handed the other's module half initialized
(a class then missing). `import_class`, the contract's module-class check and the worker's
background import take turns (`MODEL_CODE_IMPORT`)."""

from __future__ import annotations

import sys
import textwrap
import threading
import time

import pytest

import workers.main as worker_main
from gpuyantra.ops.base import import_class

MODULES = {
    "__init__.py": "",
    "sync.py": "import threading\nlog = []\nstarted = threading.Event()\nrelease = threading.Event()\n",
    # The library's core, imported in the background: it takes its time.
    "core.py": """
        from {pkg} import sync
        sync.log.append("core started")
        sync.started.set()
        sync.release.wait(10)
        sync.log.append("core done")
    """,
    "model.py": """
        import torch
        from {pkg} import sync
        sync.log.append("model")
        class Model(torch.nn.Module):
            pass
    """,
}


@pytest.fixture
def library(tmp_path, monkeypatch):
    name = "gy_model_code_library"
    package = tmp_path / name
    package.mkdir()
    for file, text in MODULES.items():
        (package / file).write_text(textwrap.dedent(text.format(pkg=name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def test_a_module_class_is_imported_after_the_background_import_of_its_library(library, monkeypatch):
    monkeypatch.setattr(worker_main, "MODEL_CODE", f"{library}.core")
    background = worker_main._import_model_code_in_background()
    sync = None
    for _ in range(1000):  # until the background import has begun (at most 10 s)
        sync = sys.modules.get(f"{library}.sync")
        started = getattr(sync, "started", None)  # in sys.modules before its body has run
        if started is not None and started.is_set():
            break
        time.sleep(0.01)
    assert sync is not None and sync.started.is_set()
    releaser = threading.Timer(0.3, sync.release.set)  # the library's import ends a little later
    releaser.start()
    try:
        found = import_class(f"{library}.model.Model")
    finally:
        releaser.join()
        background.join(30)
    assert found.__name__ == "Model"
    assert sync.log == ["core started", "core done", "model"]  # the class's module waited its turn
