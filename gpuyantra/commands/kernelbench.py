"""`gpuyantra kernelbench PATH`: the optimize loop on KernelBench-format problems (see docs/kernelbench.md)."""

from __future__ import annotations

import argparse
import json
import sys

from gpuyantra.commands import positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kernelbench",
        help="run the optimize loop on KernelBench-format problem files",
        description="Bind each KernelBench problem (Model, get_inputs, get_init_inputs) to an op family by "
        "computation, write and verify Triton candidates, write ModelNew files, print "
        "fast_0 / fast_1 / fast_2. A problem no registered family computes becomes an open target (its Model is "
        "the reference); what the open author cannot express is reported unsupported with the reason.",
    )
    parser.add_argument(
        "path",
        metavar="PATH",
        nargs="+",
        help="a problem .py file, or a folder of them (searched recursively, in natural order); several run in "
        "the order given",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="where kernels run (default: cuda when available, else cpu)",
    )
    parser.add_argument("--json", action="store_true", help="print the run as one JSON object, last on stdout")
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="where candidates and ModelNew files go, one folder per problem "
        "(default: kernelbench/ in the state folder)",
    )
    parser.add_argument(
        "--max-iterations",
        type=positive_int,
        default=None,
        metavar="N",
        help="candidates written per problem at most (default: 4)",
    )
    parser.add_argument(
        "--max-elements",
        type=positive_int,
        default=None,
        metavar="N",
        help="problems whose inputs and parameters hold more elements run at reduced sizes of themselves on cpu, "
        "or are skipped where they cannot be reduced (and always on cuda) (default on cpu: 4194304, on cuda: no cap)",
    )
    parser.set_defaults(handler=run, _parser=parser)


def run(args: argparse.Namespace) -> int:
    from gpuyantra.triton_env import prepare

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            args._parser.error("--device cuda: CUDA is not available on this machine")
    device = prepare(args.device)  # before anything imports triton

    from gpuyantra import kernelbench as kb

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def on_result(result: kb.ProblemResult) -> None:
        print(format_row(result), flush=True)

    print(HEADER, flush=True)
    try:
        outcome = kb.run(
            args.path,
            device=device,
            out=args.out,
            max_iterations=args.max_iterations or kb.DEFAULT_MAX_ITERATIONS,
            max_elements=args.max_elements if args.max_elements is not None else -1,
            log=log,
            on_result=on_result,
        )
    except kb.KernelBenchError as exc:
        print(f"gpuyantra kernelbench: {exc}", file=sys.stderr)
        return 1
    print(summary(outcome), flush=True)
    if args.json:
        print(json.dumps(outcome.to_dict(), default=str))
    return 0


HEADER = f"{'problem':<32} {'op':<15} {'status':<12} {'correct':<8} {'speedup':>8} {'reward':>6}"


def format_row(result) -> str:
    speedup = f"{result.speedup:.2f}x" if result.speedup is not None else "-"
    reward = f"{result.reward:+d}" if result.reward is not None else "-"
    row = (
        f"{result.name:<32} {result.op or '-':<15} {result.status:<12} {'yes' if result.correct else 'no':<8} "
        f"{speedup:>8} {reward:>6}"
    )
    lines = [row]
    if result.model_new:
        lines.append(f"    ModelNew: {result.model_new}")
    if result.reason:
        lines.append(f"    {result.reason}")
    if getattr(result, "regions", None):
        from gpuyantra.kernelbench.region_loop import region_lines

        lines += region_lines(result.regions)
    return "\n".join(lines)


def summary(outcome) -> str:
    n = len(outcome.problems)
    correct = sum(1 for p in outcome.problems if p.correct)
    counts: dict[str, int] = {}
    for p in outcome.problems:
        counts[p.status] = counts.get(p.status, 0) + 1
    lines = [
        f"{n} problem(s) on {outcome.device}: " + ", ".join(f"{v} {k}" for k, v in counts.items()),
        f"fast_0 = {_fmt(outcome.fast_0)} ({correct}/{n} correct)",
    ]
    for p, value in ((1, outcome.fast_1), (2, outcome.fast_2)):
        if value is None:
            lines.append(
                f"fast_{p} = null (speed is not measured on {outcome.device}: kernels run in Triton's interpreter)"
            )
        else:
            faster = round(value * n)
            lines.append(f"fast_{p} = {_fmt(value)} ({faster}/{n} correct and more than {p}x faster than Model)")
    for against, value in (
        ("torch.compile(Model)", getattr(outcome, "fast_1_vs_compile", None)),
        ("the better of Model and torch.compile(Model)", getattr(outcome, "fast_1_vs_best", None)),
    ):
        if value is not None:
            lines.append(f"fast_1 = {_fmt(value)} against {against} ({round(value * n)}/{n} correct and faster)")
    geomean = getattr(outcome, "geomean", None) or {}
    if any(v is not None for v in geomean.values()):
        lines.append(
            "geometric-mean speedup of the correct problems: "
            + ", ".join(f"{_fmt(v)}x against {k}" for k, v in geomean.items() if v is not None)
        )
    lines.append(f"results: {outcome.out}/kernelbench.json")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "null" if value is None else f"{value:.3f}"
