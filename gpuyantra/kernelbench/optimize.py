"""The optimize loop for one bound problem: the configured author writes candidates, the verifier
judges them (against the problem's Model, or the family's default module through a verification
copy), until the device's ceiling reward, an exhausted author or the iteration limit."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpuyantra.kernelbench.results import Attempt
from gpuyantra.ops import OpFamily
from gpuyantra.ops.base import import_class

DEFAULT_MAX_ITERATIONS = 4
CEILING = {"cpu": 1, "cuda": 3}


def _verifier(device: str) -> Callable[..., Any]:
    """The verifier's entry point. On a GPU it keeps a warm spare child for the next verification:
    on an H200 each problem's verification spent 10-12 s starting its child (imports, compiled
    modules, CUDA context) before anything was judged. Not on CPU, where a spare's imports would
    take a core from the interpreter running the current one."""
    from gpuyantra.verifier.core import run_verification

    return functools.partial(run_verification, keep_warm=device == "cuda")


def _verification_copy(source: str, adapter: list[dict[str, str]]) -> str:
    """The candidate's source with its ADAPTER replaced (kernel code unchanged)."""
    text = "ADAPTER = [\n" + "".join(f"    {json.dumps(b)},\n" for b in adapter) + "]\n"
    replaced, count = re.subn(r"^ADAPTER\s*=\s*\[.*?^\]\n", lambda _: text, source, count=1, flags=re.S | re.M)
    if count == 0:  # one-line or unusual ADAPTER: append an override (the last assignment wins)
        replaced = source + ("" if source.endswith("\n") else "\n") + f"ADAPTER = {json.dumps(adapter)}\n"
    return replaced


def default_module_adapter(family: OpFamily) -> list[dict[str, str]] | None:
    try:
        return family.default_adapter(import_class(family.default_module))
    except (LookupError, ValueError):
        return None


def verify_dtypes(dtype: torch.dtype, device: str) -> list[str] | None:
    name = str(dtype).replace("torch.", "")
    if device == "cpu" and name not in ("float32", "float16"):
        return None  # the interpreter's bfloat16 is unreliable: let the verifier choose
    return [name]


def verification_target(
    family: OpFamily, adapter: list[dict[str, str]], model_cls: type, dotted: str
) -> tuple[str | None, list[dict[str, str]] | None, str]:
    """(module_class for verify, ADAPTER for a verification copy or None, a note saying which).

    The verifier imports module_class in its own (parent) process and checks the ADAPTER's
    attributes on a meta-device instance it builds with tiny sizes (`Model(64)`, `Model()`...).
    When that works for the problem's Model (registered in sys.modules under `dotted`), the
    candidate is verified against it as is; otherwise against the family's default module, with a
    copy of the candidate whose ADAPTER is that module's (same kernel code)."""
    from gpuyantra.ops.meta import meta_instance

    if family.open_target is not None:
        return None, None, f"verified against the problem's own Model (open target {family.name})"
    meta = meta_instance(model_cls)
    if meta is not None and all(hasattr(meta, b["module_attr"]) for b in adapter):
        return dotted, None, f"verified against the problem's Model ({dotted})"
    verify_adapter = default_module_adapter(family)
    note = (
        f"verified against {family.default_module} (the verifier cannot build the problem's Model "
        f"on the meta device); the Model binding is checked by kernelbench"
    )
    return None, (verify_adapter if verify_adapter is not None and verify_adapter != adapter else None), note


def optimize(
    family: OpFamily,
    adapter: list[dict[str, str]],
    model_cls: type,
    dotted: str,
    shapes: list[list[int]],
    dtype: torch.dtype,
    device: str,
    folder: Path,
    max_iterations: int,
    log: Callable[[str], None],
    judge: Callable[[Attempt], bool] | None = None,
) -> tuple[list[Attempt], Attempt | None, str, str]:
    """Write, verify, repeat. Returns (attempts, best accepted attempt or None, why the loop stopped,
    what the candidates were verified against).

    With `judge` (CUDA: the whole ModelNew against the better of eager and torch.compile), every
    accepted candidate is judged and the loop stops at the first win only: the verifier's ceiling
    reward is earned on its own cases, and a kernel rated +3 there can still lose as a whole
    forward, so the search goes on through the author's other strategies until the iteration limit."""
    from gpuyantra.authors import Attempt as AuthorAttempt
    from gpuyantra.authors import WriteRequest, get_author
    from gpuyantra.hardware import hardware_class

    verify = _verifier(device)
    author = get_author()
    hardware = hardware_class(device)
    module_class, verify_adapter, verified_against = verification_target(family, adapter, model_cls, dotted)
    ceiling = CEILING.get(device, 3)
    dtypes = verify_dtypes(dtype, device)
    attempts: list[Attempt] = []
    history: list[AuthorAttempt] = []
    best: Attempt | None = None
    stop = f"--max-iterations {max_iterations} reached"
    for iteration in range(1, max_iterations + 1):
        request = WriteRequest(
            op=family.name,
            module_class=model_cls.__name__,
            adapter=adapter,
            shapes=shapes,
            dtype=str(dtype).replace("torch.", ""),
            hardware=hardware,
            history=history,
            iteration=iteration,
        )
        try:
            written = author.write(request)
        except Exception as exc:  # noqa: BLE001 - an author that cannot write this problem ends its loop, not the run
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            stop = f"the {getattr(author, 'name', 'configured')} author cannot write {family.name}: {why}"
            break
        if any(a.strategy == written.strategy for a in attempts):
            stop = f"the author's strategies are exhausted after {len(attempts)} candidates"
            break
        path = folder / f"candidate_{iteration}.py"
        path.write_text(written.source)
        verify_path = path
        if verify_adapter is not None:
            verify_path = folder / f"candidate_{iteration}.verify.py"
            verify_path.write_text(_verification_copy(written.source, verify_adapter))
        verdict = verify(verify_path, device=device, module_class=module_class, shapes=shapes, dtypes=dtypes)
        failures = [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in verdict.failures]
        attempt = Attempt(
            iteration=iteration,
            candidate=str(path),
            strategy=dict(written.strategy),
            reward=int(verdict.reward),
            accepted=bool(verdict.accepted),
            failures=failures,
            speedup_vs_eager=verdict.speedup_vs_eager,
            speedup_vs_compile=verdict.speedup_vs_compile,
            timings=dict(getattr(verdict, "timings", None) or {}),
            library_calls=list(getattr(verdict, "library_calls", None) or []),
        )
        attempts.append(attempt)
        history.append(
            AuthorAttempt(
                strategy=dict(written.strategy),
                reward=attempt.reward,
                failures=failures,
                kernel_us=getattr(verdict, "kernel_us", None),
                floor_us=getattr(verdict, "floor_us", None),
            )
        )
        first = f" ({failures[0]['layer']}/{failures[0]['rule']}: {failures[0]['message'][:160]})" if failures else ""
        log(f"  candidate {iteration}: reward {attempt.reward:+d}{first}")
        if attempt.accepted and (best is None or _rank(attempt) > _rank(best)):
            best = attempt
        if judge is not None:
            if attempt.accepted and judge(attempt):
                stop = "ModelNew beats the better of eager and torch.compile"
                break
        elif attempt.reward >= ceiling:
            stop = f"reached the {device} ceiling reward {ceiling:+d}"
            break
    return attempts, best, stop, verified_against


def _rank(attempt: Attempt) -> tuple[int, float]:
    return attempt.reward, attempt.speedup_vs_eager or 0.0
