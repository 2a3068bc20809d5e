"""`gpuyantra verify FILE`: run the trust anchor on one candidate kernel file (docs/CONTRACTS.md section 3).

Exit 0 when accepted (reward >= +1), 1 when rejected (including an unknown op or an unreadable
file), 2 on a usage error (argparse, no such FILE, a `--problem` or `--module` no target can be made
of). `--json` prints exactly one JSON object on stdout. With `--problem PROBLEM.py` or an open
`--module DOTTED.CLASS` the target is made on the spot (gpuyantra/verify_target.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuyantra.commands import stage_printer
from gpuyantra.triton_env import prepare
from gpuyantra.verify_target import NamedTarget, problem_file_error


def _shapes(text: str) -> list[list[int]]:
    """`1x2048,4x4096` or a JSON list `[[1, 2048], [4, 4096]]`."""
    try:
        if text.strip().startswith("["):
            value = json.loads(text)
            shapes = [[int(d) for d in shape] for shape in value]
        else:
            shapes = [[int(d) for d in part.lower().split("x")] for part in text.split(",") if part.strip()]
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read shapes {text!r}: use 1x2048,4x4096 ({exc})") from None
    if not shapes or any(not shape or min(shape) < 1 for shape in shapes):
        raise argparse.ArgumentTypeError(f"shapes must be positive sizes like 1x2048, got {text!r}")
    return shapes


def _dtypes(text: str) -> list[str]:
    from gpuyantra.verifier.cases import DTYPES

    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in DTYPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {unknown or text!r}; choose from {', '.join(DTYPES)}")
    return names


def _param_shape(text: str) -> tuple[str, list[int] | None]:
    """`weight=2048x1536` -> ("weight", [2048, 1536]); `bias=none` -> ("bias", None)."""
    from gpuyantra.verifier.cases import parse_param_shapes

    try:
        ((name, shape),) = parse_param_shapes([text]).items()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name, shape


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="run the trust anchor on one candidate kernel file",
        description="Static, contract, sandbox, correctness and (on CUDA) benchmark checks of one candidate "
        "file. Exit 0 accepted, 1 rejected, 2 usage error. See docs/verifier.md.",
    )
    parser.add_argument("file", metavar="FILE", help="candidate kernel file (.py)")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="where kernels run: cuda, or cpu under Triton's interpreter (default: cuda when available, else cpu)",
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--module",
        metavar="DOTTED.CLASS",
        default=None,
        help="module class the kernel would replace (default: the op's default class); for a candidate whose OP "
        "is not a registered family, the class is made an open target on the spot: built from get_init_inputs() "
        "and called on get_inputs(), found on the class or in its module",
    )
    target.add_argument(
        "--problem",
        metavar="PROBLEM.py",
        default=None,
        help="a KernelBench-format problem file (Model, get_inputs, get_init_inputs): its Model is made an open "
        "target on the spot and the candidate verified against it",
    )
    parser.add_argument(
        "--shapes",
        type=_shapes,
        default=None,
        metavar="1x2048,4x4096",
        help="live shapes of the first activation, checked (and timed on CUDA) besides the hidden shapes",
    )
    parser.add_argument(
        "--dtypes",
        type=_dtypes,
        default=None,
        metavar="float16,float32",
        help="dtypes to check (default: float32,float16 on cpu; float16,bfloat16,float32 on cuda)",
    )
    parser.add_argument(
        "--param-shape",
        dest="param_shapes",
        action="append",
        type=_param_shape,
        default=None,
        metavar="NAME=AxB",
        help="the live module's shape of a tensor parameter, repeatable: weight=2048x1536 (a linear's "
        "out-features come from it), bias=none for a module without one (default: the module class's own)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="wall-clock limit of the sandboxed run (default: 300 on cpu, 600 on cuda)",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    parser.add_argument(
        "--where",
        choices=WHERE,
        default="auto",
        help="where the verifier runs: 'worker', this machine's GPU worker (gpuyantra up), whose sandbox "
        "children are warm (seconds a verdict instead of a new process's 12 or more); 'here', this process; "
        "'auto' (default), the worker when one polls and the verification is for CUDA, else here",
    )
    parser.set_defaults(handler=run)


WHERE = ("auto", "worker", "here")


def run(args: argparse.Namespace) -> int:
    missing = candidate_file_problem(args.file)
    if missing:  # a usage error: nothing was verified, so nothing was rejected
        print(f"gpuyantra verify: {missing}", file=sys.stderr)
        return 2
    try:
        verdict = _verdict(args)
    except TargetUsageError as exc:  # the problem or module class named: nothing was verified
        print(f"gpuyantra verify: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(verdict) + "\n")
    else:
        _print_human(verdict)
    return 0 if verdict["accepted"] else 1


def _verdict(args: argparse.Namespace) -> dict[str, Any]:
    named = _named_target(args)
    say = stage_printer("verify", quiet=args.json)
    verdict = None
    if args.where != "here" and _worker_may_take(args):
        say(f"sending {args.file} to this machine's GPU worker ...")
        verdict = _on_worker(args, named)
    if verdict is None:
        say(f"verifying {args.file} in this process: static, contract, sandbox, correctness (tens of seconds) ...")
        verdict = _here(args, named)
    return verdict


class TargetUsageError(ValueError):
    """`--problem` or `--module` names something no target can be made of: exit 2, this one line."""


def candidate_file_problem(path: str) -> str | None:
    """One line when FILE is no file at all (missing, a folder); an unreadable file is the verifier's
    to reject."""
    candidate = Path(path)
    if candidate.is_dir():
        return f"{path} is a folder: give a candidate kernel file (.py)"
    if not candidate.exists():
        return f"{path}: no such file"
    return None


def _worker_may_take(args: argparse.Namespace) -> bool:
    """'worker' always tries; 'auto' only a CUDA verification (a GPU worker's own device) whose module
    class, if named, the worker imports as this process would (not a module of this folder)."""
    if args.where == "worker":
        return True
    if args.device == "cpu" or (args.device is None and not _has_nvidia_device()):
        return False
    if getattr(args, "state_dir", None):  # a state folder of its own: its caches and locks, not the worker's
        return False
    return args.module is None or not _worker_may_not_import(args.module)


def _has_nvidia_device() -> bool:
    """Without importing torch (seconds): the driver's control device node."""
    return os.path.exists("/dev/nvidiactl")


def _worker_may_not_import(dotted: str) -> bool:
    """A module class the worker may not import as this process does: one of the current folder
    (importable here because the folder is on sys.path), or one not found at all."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(dotted.split(".")[0])
    except (ImportError, ValueError):
        return True
    if spec is None or not spec.origin:
        return True
    origin = Path(spec.origin).resolve()
    # The top-level module's own folder: a package's parent, a plain module's folder.
    home = origin.parent.parent if spec.submodule_search_locations is not None else origin.parent
    return home == Path.cwd().resolve()


def _named_target(args: argparse.Namespace) -> NamedTarget:
    """The target the options name besides the candidate's OP; a problem file is read here (its text
    travels to the worker, never its path) and must define Model, get_inputs and get_init_inputs."""
    if args.problem is None:
        return NamedTarget(module_class=args.module)
    try:
        source = Path(args.problem).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetUsageError(
            f"--problem {args.problem}: cannot read it: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    why = problem_file_error(source)
    if why:
        raise TargetUsageError(f"--problem {args.problem}: {why}")
    return NamedTarget(problem_name=Path(args.problem).name, problem_source=source)


def _target_flag(args: argparse.Namespace) -> str:
    return f"--problem {args.problem}" if args.problem is not None else f"--module {args.module}"


def _on_worker(args: argparse.Namespace, named: NamedTarget) -> dict[str, Any] | None:
    """The worker's verdict, or None (with a line on stderr under 'auto') to verify here instead."""
    from gpuyantra.verify_client import TargetRefused, WorkerLost, WorkerUnavailable, verify_on_worker

    try:
        source = Path(args.file).read_text()
    except (OSError, UnicodeDecodeError):
        return None  # the local run rejects it with the reason
    request = {
        "source": source,
        "file_name": Path(args.file).name,
        "device": args.device,
        "module_class": args.module,
        "shapes": args.shapes,
        "dtypes": args.dtypes,
        "param_shapes": dict(args.param_shapes) if args.param_shapes else None,
        "timeout": args.timeout,
    }
    if named.problem_source is not None:
        request.update(problem_name=named.problem_name, problem_source=named.problem_source)
    try:
        workflow_id, verdict = verify_on_worker(request, (args.timeout or 600.0) + 300.0)
    except TargetRefused as exc:
        raise TargetUsageError(f"{_target_flag(args)}: {exc}") from None
    except WorkerUnavailable as exc:
        if args.where == "worker":
            print(f"gpuyantra verify: --where worker: {exc} (start one with `gpuyantra up`)", file=sys.stderr)
            raise SystemExit(2) from None
        if isinstance(exc, WorkerLost):  # a worker took it and lost it: say so; none at all is the usual case
            print(f"gpuyantra verify: {exc}; verifying in this process", file=sys.stderr)
        return None
    return {**verdict, "verified_by": "worker", "workflow_id": workflow_id}


def _here(args: argparse.Namespace, named: NamedTarget) -> dict[str, Any]:
    device = prepare(args.device)
    from gpuyantra.verify_target import TargetUnusable, verify_named

    if named.module_class and str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.append(str(Path.cwd()))  # a module class of the current folder, as `python -m` finds it
    try:
        source: str | None = Path(args.file).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        source = None  # the verifier rejects it as unreadable
    try:
        verdict = verify_named(
            args.file,
            named,
            source,
            device=device,
            shapes=args.shapes,
            dtypes=args.dtypes,
            timeout=args.timeout,
            param_shapes=dict(args.param_shapes or []),
        )
    except TargetUnusable as exc:
        raise TargetUsageError(f"{_target_flag(args)}: {exc}") from None
    return {**verdict.to_dict(), "verified_by": "here"}


def _print_human(verdict: dict[str, Any]) -> None:
    status = "ACCEPTED" if verdict["accepted"] else "REJECTED"
    print(
        f"{status}  op={verdict['op']}  reward={verdict['reward']:+d}  device={verdict.get('device')}  "
        f"checks={verdict.get('checks')}  {verdict.get('seconds') or 0.0:.1f}s"
    )
    if verdict.get("workflow_id"):
        print(f"verified by this machine's GPU worker: workflow {verdict['workflow_id']}")
    if verdict.get("module_class"):
        print(f"module class: {verdict['module_class']}")
    for failure in verdict.get("failures", []):
        print(f"  [{failure['layer']}/{failure['rule']}] {failure['message']}", file=sys.stdout)
    if verdict.get("speedup_vs_eager") is not None:
        compile_speedup = verdict.get("speedup_vs_compile")
        compile_text = f"{compile_speedup:.2f}x" if compile_speedup else "n/a"
        print(
            f"speedup: {verdict['speedup_vs_eager']:.2f}x vs eager, {compile_text} vs torch.compile "
            f"(kernel {verdict.get('kernel_us') or 0.0:.2f} us, eager {verdict.get('eager_us') or 0.0:.2f} us)"
        )
