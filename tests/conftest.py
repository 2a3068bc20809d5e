"""Shared fixtures. Kernels run in Triton's interpreter on this CPU-only machine; the variable
must be set before anything imports triton."""

from __future__ import annotations

import os
import secrets
import tempfile

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ["TRITON_INTERPRET"] == "1":  # kernels the tests run in this process run as in children
    from gpuyantra.interpreter_speed import install

    install()
# One CPU thread per process: the suite runs several xdist workers, servers, workers and sandbox
# children on a machine of few cores, where torch's OpenMP threads only spin against each other (a
# model test's CPU time halves with one). Set before torch loads; every process started inherits it.
for _threads_var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
    os.environ.setdefault(_threads_var, "1")
# One attestation key for the whole run: the verifier, in-process apps, helpers that sign, and every
# server and worker process the tests start (they inherit the environment) agree on it.
os.environ.setdefault("GPUYANTRA_ATTESTATION_KEY", "gpuyantra-tests-" + secrets.token_hex(16))
# The suite's own state folder (fixtures that need their own still set theirs), never the user's.
_state_root = os.environ.setdefault("GPUYANTRA_STATE_DIR", tempfile.mkdtemp(prefix="gpuyantra-tests-state-"))
# Under pytest-xdist the workers inherit the controller's environment: each takes a folder of its own
# inside it (locks, sockets and records of one worker never meet another's); the key stays shared.
if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("GPUYANTRA_TESTS_WORKER_STATE"):
    os.environ["GPUYANTRA_STATE_DIR"] = os.path.join(_state_root, os.environ["PYTEST_XDIST_WORKER"])
    os.makedirs(os.environ["GPUYANTRA_STATE_DIR"], exist_ok=True)
    os.environ["GPUYANTRA_TESTS_WORKER_STATE"] = "1"


def _shares_a_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture of this project scoped wider than one test (a server, a
    model, the Temporal dev server): pytest's and plugins' own fixtures have no base id."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope != "function" and d.baseid for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs `--dist loadgroup`: a module whose tests share a wider fixture goes to one xdist
    worker whole (the fixture starts once), every other test to whichever worker is free."""
    for item in items:
        if not item.get_closest_marker("xdist_group") and _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(scope="session", autouse=True)
def cpu_fork_server():
    """Sandbox children are forked from one server per test process, as a worker's are (torch
    imported once, not in every verification's child: 2-3 CPU-s each). Tests of the new-interpreter
    path stop it (`no_fork_server`) or start children with `fork=False`."""
    from gpuyantra.verifier import fork_server, sandbox

    sandbox.start_fork_server("cpu")
    yield
    sandbox.close_spares()
    fork_server.close_all()


@pytest.fixture(autouse=True)
def _fork_server_kept(cpu_fork_server):
    """A test that stopped or killed the server (the fork server's own tests) leaves one running."""
    yield
    from gpuyantra.verifier import fork_server, sandbox

    if fork_server.running("cpu") is None:
        sandbox.start_fork_server("cpu")


@pytest.fixture
def no_fork_server(cpu_fork_server):
    """Children start as new interpreters for this test (the server is started again after it)."""
    from gpuyantra.verifier import fork_server

    fork_server.close_all()
    yield
