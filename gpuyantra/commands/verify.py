"""`gpuyantra verify FILE`: run the trust anchor on one candidate kernel file (docs/CONTRACTS.md section 3).

Exit 0 when accepted (reward >= +1), 1 when rejected (including an unknown op or an unreadable
file), 2 on a usage error (argparse). `--json` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuyantra.triton_env import prepare


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
    parser.add_argument(
        "--module",
        metavar="DOTTED.CLASS",
        default=None,
        help="module class the kernel would replace (default: the op's default class)",
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
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    device = prepare(args.device)
    from gpuyantra.verifier.core import run_verification

    verdict = run_verification(
        args.file,
        device=device,
        module_class=args.module,
        shapes=args.shapes,
        dtypes=args.dtypes,
        timeout=args.timeout,
        param_shapes=dict(args.param_shapes or []),
    )
    if args.json:
        sys.stdout.write(json.dumps(verdict.to_dict()) + "\n")
    else:
        _print_human(verdict)
    return 0 if verdict.accepted else 1


def _print_human(verdict: Any) -> None:
    status = "ACCEPTED" if verdict.accepted else "REJECTED"
    print(
        f"{status}  op={verdict.op}  reward={verdict.reward:+d}  device={verdict.device}  "
        f"checks={verdict.checks}  {verdict.seconds:.1f}s"
    )
    if verdict.module_class:
        print(f"module class: {verdict.module_class}")
    for failure in verdict.failures:
        print(f"  [{failure.layer}/{failure.rule}] {failure.message}", file=sys.stdout)
    if verdict.speedup_vs_eager is not None:
        compile_text = f"{verdict.speedup_vs_compile:.2f}x" if verdict.speedup_vs_compile else "n/a"
        print(
            f"speedup: {verdict.speedup_vs_eager:.2f}x vs eager, {compile_text} vs torch.compile "
            f"(kernel {verdict.kernel_us:.2f} us, eager {verdict.eager_us:.2f} us)"
        )
