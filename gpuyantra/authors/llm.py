"""The LLM author: asks a language model for a candidate file, falls back to the template author.

The prompt carries everything the verifier will hold the candidate to: the op family's entry
signature and reference source, the ADAPTER the target module needs, the allowed imports, the
anti-cheating rules, the live shapes, dtype and hardware, the seed skill's source, and the
verifier's feedback on every earlier attempt. The reply is structured (`CandidateReply`: named
fields only, the ADAPTER a list of `{kernel_param, module_attr}` objects, never a free-form dict),
so it parses without guessing.

A reply it cannot use (no JSON, missing fields, source that does not parse, wrong OP, a backend
that keeps failing) does not stop the campaign: the template author writes the candidate instead,
and `author` / `notes` say so ("template (llm fallback: <reason>)").
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import re
import textwrap
import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from gpuyantra.authors.backends import Backend, BackendError, GeminiBackend, OpenAICompatibleBackend
from gpuyantra.authors.base import Attempt, WriteRequest, WrittenCandidate
from gpuyantra.rewards import REWARD_ACCEPTED

log = logging.getLogger(__name__)

ALLOWED_IMPORTS = ("torch", "triton", "triton.language", "math", "typing")
DEFAULT_GEMINI_MODEL = "gemini-2.5-flash"
DEFAULT_TIMEOUT_S = 180.0  # one request
DEFAULT_DEADLINE_S = 240.0  # all attempts of one write (the write_candidate activity allows 5 minutes)
DEFAULT_MAX_ATTEMPTS = 3
MAX_HISTORY = 8  # most recent attempts shown to the model
_MESSAGE_CHARS = 1500


# --- the structured reply ------------------------------------------------------------------------


class AdapterBinding(BaseModel):
    kernel_param: str = Field(description="keyword parameter of entry, e.g. 'eps'")
    module_attr: str = Field(description="attribute of the replaced module that supplies it, e.g. 'variance_epsilon'")


class Strategy(BaseModel):
    name: str = Field(description="short name of the optimization strategy, e.g. 'one-row-per-program'")
    notes: str = Field(description="what the kernel does and why it should be correct and fast")


class CandidateReply(BaseModel):
    # The strategy comes first: a model that decodes in schema order states its plan before the code.
    strategy: Strategy
    source: str = Field(description="the complete candidate .py file")
    adapter: list[AdapterBinding] = Field(description="the file's ADAPTER, one binding per keyword parameter")


class UnusableReply(ValueError):
    """The model's reply cannot become a candidate; the message is the reason, kept short."""


# --- prompt --------------------------------------------------------------------------------------

SYSTEM_PROMPT = """\
You are an expert GPU kernel engineer. You write Triton kernels that replace one operation of a \
served PyTorch model. Every file you write is checked by an automatic verifier: static rules \
against reward hacking, the file contract, a sandboxed run, numerical correctness against the \
reference on random inputs at many shapes, and a benchmark against eager PyTorch and \
torch.compile. A file that breaks any rule scores -1. Answer with one JSON object that follows \
the given schema exactly, and nothing else."""

RULES = """\
- The file is imported from disk as a module. It defines, at top level: `OP` (a string),
  `ADAPTER` (a list of {{"kernel_param": ..., "module_attr": ...}} dicts), one or more
  `@triton.jit` kernels, and `entry`.
- Imports: only {imports}. Nothing else (no functools, no os, no numpy).
- All arithmetic of the op runs inside `@triton.jit` kernels. On the path from `entry`, torch is
  allowed only for metadata and allocation: `.shape`, `.stride()`, `.reshape`/`.view`,
  `.contiguous()` of a non-contiguous input, `torch.empty`/`torch.empty_like`,
  `torch.promote_types`. No torch compute (no `torch.nn.functional.*`, `torch.rsqrt`, `.sum()`,
  `.mean()`, `.pow()`, `*` on tensors, `torch.matmul`, ...), not even for part of the work.
- `entry` launches a Triton kernel on every call. No early-return path that skips the kernel, no
  returning an input unchanged, no returning memory the kernel did not write.
- No try/except and no fallbacks to PyTorch or to another implementation.
- No shape guards: `entry` handles every input shape (any number of leading dimensions, any
  hidden size) and both float16/bfloat16/float32 inputs. Do not assert, raise or branch to
  non-kernel code for shapes you did not tune for. Choosing between kernels by size is fine when
  every branch launches a kernel.
- No module-level caches or state: no dicts/lists filled across calls, no memoization, no
  globals written by `entry`. Module-level constants (block sizes, num_warps) are fine.
- Every `@triton.jit` kernel you define is launched from `entry` (no decoy kernels)."""


def library_rule(family: Any) -> list[str]:
    """The one exception to "no torch compute", for an open target whose forward computes a
    convolution, GEMM or attention: those library calls (cuDNN, cuBLAS) with the rest fused in Triton."""
    from gpuyantra.ops.open.library import ENTRY_POINTS, permitted_kinds

    kinds = permitted_kinds(family)
    if not kinds:
        return []
    calls = ", ".join(f"`{path}`" for path, kind in ENTRY_POINTS.items() if kind in kinds)
    return [
        f"- Exception for this target (its forward computes {', '.join(sorted(kinds))}): entry may call {calls} "
        "on the host, written with these full names (`import torch`; `torch.nn.functional` is not importable). "
        "Keep the library where it wins and write everything around it (bias, activations, norms, pooling, "
        "reductions) as Triton kernels fused into as few passes as possible; at least one of your kernels must "
        "launch. Any other torch compute is still a cheat."
    ]


def _dtype_tolerance(family: Any, dtype: str) -> str:
    try:
        import torch

        torch_dtype = getattr(torch, dtype)
        atol, rtol = family.tolerance(torch_dtype)
        return f"atol={atol:g}, rtol={rtol:g} against a float64 reference"
    except (AttributeError, TypeError):
        return "the family's tolerance for that dtype"


def reference_source(family: Any, max_functions: int = 6) -> str:
    """The family's `reference` source, followed by the gpuyantra helpers it calls (recursively).

    `inspect.getsource(reference)` alone would hide e.g. rope's `_apply` or the `compute_dtype`
    that decides the accumulation dtype; the model must see the whole computation. An open target's
    reference is its module's forward: its class source, structure, float attributes and inputs.
    """
    if getattr(family, "open_target", None) is not None:
        from gpuyantra.ops.open import describe_reference

        return describe_reference(family.open_target)
    functions: list[Any] = []
    pending = [family.reference]
    while pending and len(functions) < max_functions:
        function = inspect.unwrap(pending.pop(0))
        if function in functions:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(function))
        except (OSError, TypeError):
            continue
        functions.append(function)
        scope = getattr(function, "__globals__", {})
        for node in ast.walk(ast.parse(source)):
            target = None
            if isinstance(node, ast.Name):
                target = scope.get(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                owner = scope.get(node.value.id)
                if inspect.ismodule(owner) and owner.__name__.startswith("gpuyantra"):
                    target = getattr(owner, node.attr, None)
            if (
                inspect.isfunction(target)
                and target.__module__.startswith("gpuyantra")
                and target not in functions
                and target not in pending
            ):
                pending.append(target)
    parts = []
    for function in functions:
        header = "" if function is functions[0] else f"# helper {function.__module__}.{function.__qualname__}\n"
        parts.append(header + textwrap.dedent(inspect.getsource(function)).rstrip())
    return "\n\n".join(parts)


def entry_signature(family: Any) -> str:
    params = [spec.name for spec in family.params]
    args = ", ".join(family.activations)
    return f"def entry({args}{', *, ' + ', '.join(params) if params else ''})"


def _shape_lines(family: Any, request: WriteRequest) -> list[str]:
    lines = []
    try:
        import torch

        torch_dtype = getattr(torch, request.dtype)
    except (AttributeError, TypeError):
        torch_dtype = None
    for shape in request.shapes:
        line = f"  - {family.activations[0]} shape {list(shape)}"
        if torch_dtype is not None:
            try:
                line += (
                    f": about {family.bytes_moved(shape, torch_dtype)} bytes moved and "
                    f"{family.flops(shape)} flops per call"
                )
            except Exception:  # a roofline model that cannot size this shape only loses the hint
                pass
        lines.append(line)
    return lines or ["  - (no live shapes were profiled; write for any (..., H) input)"]


def _attempt_lines(index: int, attempt: Attempt) -> list[str]:
    lines = [f"Attempt {index}: strategy {json.dumps(attempt.strategy, sort_keys=True)} -> reward {attempt.reward}"]
    for failure in attempt.failures:
        layer = failure.get("layer", "?")
        rule = failure.get("rule", "?")
        message = str(failure.get("message", ""))[:_MESSAGE_CHARS]
        lines.append(f"  failure [{layer}/{rule}]: {message}")
    if attempt.kernel_us is not None:
        timing = f"  kernel time {attempt.kernel_us:.2f} us"
        if attempt.floor_us:
            timing += (
                f" vs roofline floor {attempt.floor_us:.2f} us ({attempt.kernel_us / attempt.floor_us:.1f}x the floor)"
            )
        lines.append(timing)
    elif attempt.floor_us is not None:
        lines.append(f"  roofline floor {attempt.floor_us:.2f} us (kernel time not measured)")
    if attempt.reward >= REWARD_ACCEPTED and not attempt.failures:
        lines.append("  (correct; make it faster without breaking correctness)")
    return lines


def build_prompt(request: WriteRequest) -> str:
    """The user prompt for one write request."""
    from gpuyantra.ops import get_op

    family = get_op(request.op)
    adapter_json = json.dumps(request.adapter)
    outputs = "a tensor" if family.n_outputs == 1 else f"a tuple of {family.n_outputs} tensors"
    passed = [p.name for p in family.params if p.name not in family.adapter_params]
    keywords = "  Every keyword parameter of `entry` appears in ADAPTER and nothing else does."
    if passed:
        keywords = (
            f"  Every keyword parameter of `entry` appears in ADAPTER except {', '.join(passed)}: numbers the "
            "forward takes as arguments, which its caller passes (the verifier draws a float one at other "
            "values: never bake it)."
        )
    parts = [
        f"Write a Triton candidate file for the op family `{request.op}`, replacing instances of "
        f"`{request.module_class}` in a served model.",
        "",
        "## Contract",
        f"- `OP = {request.op!r}`",
        f"- Entry signature: `{entry_signature(family)}` - activations positional, module parameters "
        f"keyword-only. It allocates the output, launches the kernel(s) and returns {outputs}.",
        f"- `ADAPTER` must be exactly this list (kernel parameter <- attribute of `{request.module_class}`):",
        f"  {adapter_json}",
        keywords,
        f"- Output dtype: the dtype `{request.op}`'s reference returns (see below).",
        "",
        "## Reference semantics (the exact math; your output must match it)",
        "```python",
        reference_source(family),
        "```",
        "",
        "## Rules the verifier enforces",
        RULES.format(imports=", ".join(f"`{name}`" for name in ALLOWED_IMPORTS)),
        *library_rule(family),
        "",
        "## Where it runs",
        f"- Hardware: {request.hardware}",
        f"- Live dtype: {request.dtype} (correctness tolerance {_dtype_tolerance(family, request.dtype)})",
        "- Live shapes (the verifier also tests other shapes):",
        *_shape_lines(family, request),
    ]
    if request.hardware == "cpu":
        parts.append(
            "- On this CPU host kernels run in Triton's interpreter (TRITON_INTERPRET=1): only "
            "correctness is judged, so prefer simple, obviously correct kernels."
        )
    if request.seed_source:
        parts += [
            "",
            "## Seed: a verified kernel from the skill library for a similar target",
            f"Its strategy: {json.dumps(request.seed_strategy, sort_keys=True)}" if request.seed_strategy else "",
            "Start from it; keep what makes it correct, change what could make it faster.",
            "```python",
            request.seed_source.rstrip(),
            "```",
        ]
    if request.history:
        shown = request.history[-MAX_HISTORY:]
        first = len(request.history) - len(shown) + 1
        parts += ["", "## Verifier feedback on earlier attempts for this target (oldest first)"]
        for offset, attempt in enumerate(shown):
            parts += _attempt_lines(first + offset, attempt)
        parts.append("Fix every failure above; do not repeat a strategy that failed.")
    parts += [
        "",
        "## Reply",
        'One JSON object: {"strategy": {"name": "<short name>", "notes": "<what and why>"}, '
        '"source": "<the complete .py file>", "adapter": [{"kernel_param": "...", "module_attr": "..."}, ...]}. '
        "`adapter` repeats the file's ADAPTER. No markdown fences inside `source`.",
        f"This is iteration {request.iteration}.",
    ]
    return "\n".join(part for part in parts if part is not None)


# --- reply parsing -------------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:json|python|py)?\s*\n(.*?)\n?```", re.S)


def _json_object(text: str) -> Any:
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    for block in _FENCE.findall(text):  # servers that ignore response_format may fence the JSON
        try:
            return json.loads(block)
        except ValueError:
            continue
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            return json.loads(text[start : end + 1])
        except ValueError:
            pass
    raise UnusableReply(f"reply is not JSON: {text[:80]!r}")


def _strip_fence(source: str) -> str:
    stripped = source.strip()
    if stripped.startswith("```"):
        match = _FENCE.fullmatch(stripped)
        if match:
            return match.group(1).strip() + "\n"
    return source if source.endswith("\n") else source + "\n"


def _top_level_literal(tree: ast.Module, name: str) -> tuple[bool, Any]:
    """(assigned, value) of a top-level `name = <literal>`; value None when not a literal."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                return True, ast.literal_eval(value)
            except ValueError:
                return True, None
    return False, None


def parse_reply(text: str, request: WriteRequest) -> tuple[str, list[dict[str, str]], dict[str, str], list[str]]:
    """(source, adapter, strategy, remarks) from a reply, or UnusableReply with the reason."""
    from gpuyantra.candidate import CandidateError, validate_adapter

    data = _json_object(text)
    if not isinstance(data, dict):
        raise UnusableReply(f"reply is JSON but not an object: {type(data).__name__}")
    try:
        reply = CandidateReply.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'reply'}: {e['msg']}" for e in exc.errors()[:3])
        raise UnusableReply(f"reply does not follow the schema ({problems})") from None
    source = _strip_fence(reply.source)
    if not source.strip():
        raise UnusableReply("reply has an empty source")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UnusableReply(f"source is not valid Python (line {exc.lineno}: {exc.msg})") from None
    assigned, op = _top_level_literal(tree, "OP")
    if not assigned:
        raise UnusableReply("source defines no top-level OP")
    if op != request.op:
        raise UnusableReply(f"source's OP is {op!r}, expected {request.op!r}")
    try:
        adapter = validate_adapter([binding.model_dump() for binding in reply.adapter])
    except CandidateError as exc:
        raise UnusableReply(f"reply adapter is invalid: {exc}") from None
    remarks = []
    assigned, source_adapter = _top_level_literal(tree, "ADAPTER")
    if not assigned:
        remarks.append("the source defines no ADAPTER")
    elif source_adapter != adapter:
        remarks.append(f"reply adapter {json.dumps(adapter)} differs from the source's ADAPTER; the source's stands")
    if adapter != list(request.adapter):
        remarks.append(f"reply adapter {json.dumps(adapter)} differs from the requested {json.dumps(request.adapter)}")
    strategy = {"name": reply.strategy.name.strip() or "unnamed", "notes": reply.strategy.notes.strip()}
    return source, adapter, strategy, remarks


# --- the author ----------------------------------------------------------------------------------


class LLMAuthor:
    """An author backed by an LLM; see the module docstring."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float = DEFAULT_DEADLINE_S,
        backoff_s: float = 2.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.backend = backend
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.backoff_s = backoff_s

    @property
    def name(self) -> str:
        return f"llm:{self.backend.name}:{self.backend.model or 'auto'}"

    def __repr__(self) -> str:
        return f"LLMAuthor({self.backend!r})"

    def write(self, request: WriteRequest) -> WrittenCandidate:
        try:
            prompt = build_prompt(request)
        except Exception as exc:  # e.g. an op the registry does not know: nothing to ask for
            return self._fallback(request, f"cannot build the prompt: {type(exc).__name__}: {exc}")
        try:
            text, attempts = self._complete(prompt)
        except BackendError as exc:
            return self._fallback(request, str(exc))
        try:
            source, adapter, strategy, remarks = parse_reply(text, request)
        except UnusableReply as exc:
            return self._fallback(request, str(exc))
        notes = f"{self.name} wrote strategy {strategy['name']!r}: {strategy['notes']}"
        if attempts > 1:
            notes += f" (after {attempts} attempts)"
        if remarks:
            notes += " [" + "; ".join(remarks) + "]"
        log.info("%s wrote a %s candidate (strategy %s)", self.name, request.op, strategy["name"])
        return WrittenCandidate(source=source, strategy=strategy, author=self.name, notes=notes)

    def _redact(self, text: str) -> str:
        redact = getattr(self.backend, "redact", None)
        return redact(text) if callable(redact) else text

    def _complete(self, prompt: str) -> tuple[str, int]:
        """The reply text and the number of attempts it took; BackendError after the last one."""
        start = time.monotonic()
        last: BackendError | None = None
        for attempt in range(1, self.max_attempts + 1):
            remaining = self.deadline_s - (time.monotonic() - start)
            if remaining <= 1.0:
                break
            try:
                return self.backend.complete(
                    SYSTEM_PROMPT, prompt, CandidateReply, min(self.timeout_s, remaining)
                ), attempt
            except BackendError as exc:
                last = exc
            except Exception as exc:  # an SDK surprise must not end the campaign
                last = BackendError(self._redact(f"{type(exc).__name__}: {exc}"), retryable=False)
            log.warning("%s attempt %d/%d failed: %s", self.name, attempt, self.max_attempts, last)
            if not last.retryable or attempt == self.max_attempts:
                break
            delay = self.backoff_s * 2 ** (attempt - 1)
            if last.retry_after is not None:
                delay = max(delay, last.retry_after)
            if time.monotonic() - start + delay >= self.deadline_s:
                break
            time.sleep(delay)
        if last is None:
            last = BackendError(f"no attempt fit in the {self.deadline_s:.0f} s deadline", retryable=False)
        elif last.retryable:
            last = BackendError(f"{last} (gave up after {attempt} attempts)", retryable=False, status=last.status)
        raise last

    def _fallback(self, request: WriteRequest, reason: str) -> WrittenCandidate:
        from gpuyantra.authors.template import TemplateAuthor

        reason = self._redact(" ".join(reason.split()))[:300]
        log.warning("%s: falling back to the template author: %s", self.name, reason)
        try:
            written = TemplateAuthor().write(request)
        except Exception as exc:
            raise RuntimeError(
                f"{self.name} reply unusable ({reason}) and the template author failed too: {exc}"
            ) from exc
        return WrittenCandidate(
            source=written.source,
            strategy=written.strategy,
            author=f"template (llm fallback: {reason})",
            notes=f"{self.name} gave no usable candidate ({reason}); the template author wrote this one. "
            f"{written.notes}",
        )


# --- configuration -------------------------------------------------------------------------------


def _env(environ: Mapping[str, str], key: str) -> str | None:
    value = environ.get(key)
    return value.strip() if value and value.strip() else None


def _env_number(environ: Mapping[str, str], key: str, default: float, kind: type = float) -> Any:
    raw = _env(environ, key)
    if raw is None:
        return kind(default)
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{key} must be a {'whole ' if kind is int else ''}number, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{key} must be positive, got {raw!r}")
    return value


def author_from_env(kind: str, environ: Mapping[str, str] | None = None) -> LLMAuthor:
    """The LLM author GPUYANTRA_AUTHOR=openai|gemini configures (see docs/authors.md)."""
    environ = os.environ if environ is None else environ
    base_url = _env(environ, "GPUYANTRA_LLM_BASE_URL")
    model = _env(environ, "GPUYANTRA_LLM_MODEL")
    options = {
        "timeout_s": _env_number(environ, "GPUYANTRA_LLM_TIMEOUT", DEFAULT_TIMEOUT_S),
        "max_attempts": _env_number(environ, "GPUYANTRA_LLM_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS, int),
    }
    if kind == "openai":
        if base_url is None:
            raise ValueError(
                "GPUYANTRA_AUTHOR=openai needs GPUYANTRA_LLM_BASE_URL, the API root of an "
                "OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1)"
            )
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"GPUYANTRA_LLM_BASE_URL must be an http(s) URL, got {base_url!r}")
        backend: Backend = OpenAICompatibleBackend(base_url, model, _env(environ, "GPUYANTRA_LLM_API_KEY"))
        return LLMAuthor(backend, **options)
    if kind == "gemini":
        api_key = (
            _env(environ, "GPUYANTRA_LLM_API_KEY") or _env(environ, "GEMINI_API_KEY") or _env(environ, "GOOGLE_API_KEY")
        )
        if api_key is None:
            raise ValueError(
                "GPUYANTRA_AUTHOR=gemini needs an API key: set GEMINI_API_KEY "
                "(or GOOGLE_API_KEY, or GPUYANTRA_LLM_API_KEY)"
            )
        if base_url is not None and not base_url.startswith(("http://", "https://")):
            raise ValueError(f"GPUYANTRA_LLM_BASE_URL must be an http(s) URL, got {base_url!r}")
        return LLMAuthor(GeminiBackend(model or DEFAULT_GEMINI_MODEL, api_key, base_url), **options)
    raise ValueError(f"unknown LLM author {kind!r}; known: openai, gemini")
