"""`gpuyantra verify FILE --problem PROBLEM.py` and `--module DOTTED.CLASS`: the open target built on
the spot, an honest candidate accepted and a wrong one rejected through each, the target's name
given to a candidate that names another op, and the usage errors (exit 2, one line). In-process
(`gpuyantra.cli.main`), on the CPU under Triton's interpreter, float32 only to stay quick."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyantra.cli import main

HERE = Path(__file__).parent
PROBLEM = HERE / "scaled_add_problem.py"
KERNEL = HERE / "scaled_add_kernel.py"
MODULE_CLASS = "tests.verify_open.modules.ScaledAdd"
QUICK = ["--device", "cpu", "--dtypes", "float32", "--where", "here", "--json"]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state folder of the test's own; no warm sandbox child is left behind."""
    from gpuyantra.verifier import sandbox as sandbox_module

    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path / "state"))
    yield tmp_path / "state"
    sandbox_module.close_spares()


def verify(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, dict]:
    code = main(["verify", *map(str, args), *QUICK])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return code, json.loads(lines[0])


def candidate(folder: Path, op: str, wrong: bool = False) -> Path:
    source = KERNEL.read_text().replace("OPNAME", op)
    if wrong:  # a subtraction where the target adds
        source = source.replace("(a + scale * b)", "(a - scale * b)")
    path = folder / ("wrong.py" if wrong else "honest.py")
    path.write_text(source)
    return path


def target_named(capsys: pytest.CaptureFixture[str], *target: str | Path) -> str:
    """The target's name, as a candidate naming another op learns it (rejected at the contract layer)."""
    code, verdict = verify(capsys, KERNEL, *target)
    assert code == 1 and verdict["accepted"] is False and verdict["checks"] == 0
    (failure,) = verdict["failures"]
    assert (failure["layer"], failure["rule"]) == ("contract", "unknown-op")
    found = re.search(r'set OP = "(open\.[a-z0-9_]+)"', failure["message"])
    assert found and "'OPNAME'" in failure["message"], failure
    return found.group(1)


def test_a_problem_is_made_a_target_and_candidates_judged_against_it(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    op = target_named(capsys, "--problem", PROBLEM)
    assert op.startswith("open.scaled_add_problem_")
    # Kept by its text, not its path; saved for the sandbox child.
    assert [p.name for p in (state / "problems").glob("*/*.py")] == ["scaled_add_problem.py"]
    assert (state / "targets" / op / "target.json").is_file()

    code, verdict = verify(capsys, candidate(tmp_path, op), "--problem", PROBLEM)
    assert code == 0, verdict["failures"]
    assert verdict["accepted"] is True and verdict["reward"] == 1 and verdict["op"] == op
    assert verdict["verified_by"] == "here" and verdict["module_class"].endswith(".Model")

    code, verdict = verify(capsys, candidate(tmp_path, op, wrong=True), "--problem", PROBLEM)
    assert code == 1 and verdict["accepted"] is False and verdict["reward"] == -1
    assert "correctness" in {f["layer"] for f in verdict["failures"]}


def test_the_name_follows_the_problem_text_not_its_path(state: Path, tmp_path: Path) -> None:
    from gpuyantra.verify_target import problem_target

    elsewhere = tmp_path / "copy" / PROBLEM.name
    elsewhere.parent.mkdir()
    elsewhere.write_text(PROBLEM.read_text())
    first = problem_target(PROBLEM.name, PROBLEM.read_text())
    assert problem_target(elsewhere.name, elsewhere.read_text()).op == first.op
    changed = PROBLEM.read_text().replace("return [0.75]", "return [0.25]")
    assert problem_target(PROBLEM.name, changed).op != first.op  # another text, another module


def test_a_module_class_is_made_a_target_and_candidates_judged_against_it(
    state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    op = target_named(capsys, "--module", MODULE_CLASS)
    assert op.startswith("open.scaledadd_")

    code, verdict = verify(capsys, candidate(tmp_path, op), "--module", MODULE_CLASS)
    assert code == 0, verdict["failures"]
    assert verdict["accepted"] is True and verdict["op"] == op and verdict["module_class"].endswith(".ScaledAdd")

    code, verdict = verify(capsys, candidate(tmp_path, op, wrong=True), "--module", MODULE_CLASS)
    assert code == 1 and "correctness" in {f["layer"] for f in verdict["failures"]}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--problem", "nowhere/missing_problem.py"],
            "gpuyantra verify: --problem nowhere/missing_problem.py: cannot read it: No such file or directory",
        ),
        (
            ["--problem", str(HERE / "modules.py")],
            f"gpuyantra verify: --problem {HERE / 'modules.py'}: not a KernelBench problem: defines no Model, "
            "get_inputs, get_init_inputs",
        ),
        (
            ["--problem", str(PROBLEM), "--module", MODULE_CLASS],
            "gpuyantra verify: error: argument --module: not allowed with argument --problem "
            "(usage: gpuyantra verify --help)",
        ),
        (
            ["--module", "gy_no_such_module.Thing"],
            "gpuyantra verify: --module gy_no_such_module.Thing: cannot import module class "
            "'gy_no_such_module.Thing': No module named 'gy_no_such_module'",
        ),
        (
            ["--module", "tests.verify_open.modules.NoInputs"],
            "gpuyantra verify: --module tests.verify_open.modules.NoInputs: defines no get_inputs() (on the class "
            "or in its module): the inputs to build the target from",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    state: Path, capsys: pytest.CaptureFixture[str], args: list[str], line: str
) -> None:
    try:
        code = main(["verify", str(KERNEL), *args, *QUICK])
    except SystemExit as exited:  # argparse's own errors leave this way
        code = int(exited.code or 0)
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().splitlines() == [line]


def test_a_family_candidate_keeps_module_as_the_class_its_adapter_is_checked_against(state: Path) -> None:
    from gpuyantra.verify_target import NamedTarget, wants_open_target

    family = 'OP = "rms_norm"\n'
    named = NamedTarget(module_class="transformers.models.llama.modeling_llama.LlamaRMSNorm")
    assert not wants_open_target(named, family)
    assert wants_open_target(named, 'OP = "open.mine"\n') and wants_open_target(named, None)
    assert wants_open_target(NamedTarget(problem_name="p.py", problem_source="..."), family)
    assert not wants_open_target(NamedTarget(), 'OP = "open.mine"\n')


def test_the_worker_keeps_a_problem_under_its_own_folder_whatever_its_name(state: Path) -> None:
    from gpuyantra.verify_target import keep_problem

    kept = keep_problem("../../etc/passwd.py", "x = 1\n")
    assert kept.name == "passwd.py" and kept.parent.parent == state / "problems"
    assert keep_problem("..\\evil name.py", "x = 1\n").name == "evil_name.py"


def test_each_sandbox_child_gets_its_own_copy_of_the_target(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The children read nothing of the state folder: the candidate's and the compiling child's
    (`precompile_beside`, CUDA) each get the target, and the problem file it imports, in their folder."""
    from types import SimpleNamespace

    from gpuyantra.verifier import core, precompile_beside
    from gpuyantra.verify_target import problem_target

    target = problem_target(PROBLEM.name, PROBLEM.read_text())
    handed: dict = {}
    monkeypatch.setattr(precompile_beside, "start", lambda job, folder, compiler: handed.update(job) or "beside")
    own = str(tmp_path / "candidate" / "open_target")
    job = {"open_target": own}
    compiler = SimpleNamespace(workdir=tmp_path / "compiler")
    assert core._start_beside(job, target.op, tmp_path / "candidate", compiler) == "beside"  # type: ignore[arg-type]
    assert job["open_target"] == own and handed["open_target"] == str(compiler.workdir / "open_target")
    meta = json.loads((compiler.workdir / "open_target" / "target.json").read_text())
    assert Path(meta["source_file"]) == compiler.workdir / "open_target" / "source" / PROBLEM.name
    assert (compiler.workdir / "open_target" / "module.pt").is_file()
