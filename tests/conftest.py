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


# Modules whose tests run whole verifications, authored kernels, served models or benchmark scripts
# in Triton's interpreter: tens of CPU-seconds a test. Marked `slow`; `make test-fast` leaves them
# (and the `integration` tests) out, `make test` runs everything.
SLOW_MODULES = frozenset(
    {
        "tests/authors/test_opengen.py",
        "tests/authors/test_opengen_matmul.py",
        "tests/authors/test_opengen_numerics.py",
        "tests/kernelbench/test_kernelbench.py",
        "tests/kernelbench/test_library_calls.py",
        "tests/kernelbench/test_model_new_check.py",
        "tests/kernelbench/test_reduced_model.py",
        "tests/kernelbench/test_regions.py",
        "tests/ops/test_binding.py",
        "tests/ops/test_linear.py",
        "tests/ops/test_open_targets.py",
        "tests/ops/test_templates.py",
        "tests/report/test_report.py",
        "tests/serving/test_attention.py",
        "tests/serving/test_engine.py",
        "tests/serving/test_fusion.py",
        "tests/serving/test_linear_swap.py",
        "tests/serving/test_mixed_steps.py",
        "tests/skills/test_store.py",
        "tests/test_benchmarks.py",
        "tests/test_cli.py",
        "tests/test_errors_doc.py",
        "tests/verifier/test_adversarial.py",
        "tests/verifier/test_cli.py",
        "tests/verifier/test_conditioning.py",
        "tests/verifier/test_fork_server.py",
        "tests/verifier/test_linear.py",
        "tests/verifier/test_outputs.py",
        "tests/verifier/test_plan_classes.py",
        "tests/verifier/test_precompile_beside.py",
        "tests/verifier/test_realistic_inputs.py",
        "tests/verifier/test_timings.py",
        "tests/verifier/test_verdict_reuse.py",
        "tests/workflow/test_campaign_logic.py",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs `--dist loadgroup`: a module whose tests share a wider fixture goes to one xdist
    worker whole (the fixture starts once), every other test to whichever worker is free. Tests of
    SLOW_MODULES are marked `slow`."""
    for item in items:
        module = item.nodeid.split("::")[0]
        if not item.get_closest_marker("xdist_group") and _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(module))
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


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
