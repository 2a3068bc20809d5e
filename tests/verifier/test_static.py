"""Layer 1, the AST checker: one cheating snippet (at least) per static rule, and honest code that
must pass untouched (no false positives on the project's own templates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuyantra.ops import get_op
from gpuyantra.verifier.rules import RULES
from gpuyantra.verifier.static import check_source
from tests.verifier.conftest import CANDIDATES, HEADER, HONEST_ENTRY

RMS = get_op("rms_norm")


def static_rules(source: str) -> set[str]:
    report = check_source(source, "<test>", RMS)
    for failure in report.failures:
        assert failure.layer == "static" and failure.rule in RULES, failure
        assert failure.message
    return {f.rule for f in report.failures}


def entry_with(*lines: str, ret: str = "y.view(x.shape)") -> str:
    """An honest entry with `lines` inserted before the launch (4-space indented)."""
    body = "\n".join(f"    {line}" for line in lines)
    return f"""
def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
{body}
    _rms_rows[(x2.shape[0],)](x2, weight, y, hidden, eps, BLOCK=triton.next_power_of_2(hidden))
    return {ret}
"""


# (rule, id, code appended to the shared header). Each line of the static layer has a row.
CHEATS = [
    # imports outside the allowed set
    ("import-not-allowed", "os", "import os\n" + HONEST_ENTRY),
    ("import-not-allowed", "ctypes", "import ctypes as c\n" + HONEST_ENTRY),
    ("import-not-allowed", "subprocess-in-function", entry_with("import subprocess")),
    ("import-not-allowed", "torch-submodule", "import torch.nn.functional as F\n" + HONEST_ENTRY),
    ("import-not-allowed", "from-torch-submodule", "from torch.nn import functional\n" + HONEST_ENTRY),
    ("import-not-allowed", "relative", "from . import helpers\n" + HONEST_ENTRY),
    ("import-not-allowed", "star", "from triton.language import *\n" + HONEST_ENTRY),
    # torch compute reachable from entry, however aliased
    ("torch-compute", "direct", entry_with("z = torch.rsqrt(x)")),
    ("torch-compute", "getattr-literal", entry_with('f = getattr(torch, "rsqrt")')),
    ("torch-compute", "getattr-chain", entry_with('f = getattr(getattr(torch, "nn"), "functional")')),
    ("torch-compute", "from-import", "from torch import rsqrt\n" + HONEST_ENTRY),
    ("torch-compute", "import-alias", "import torch as T\n" + entry_with("z = T.softmax(x, -1)")),
    ("torch-compute", "torch-ops", entry_with("z = torch.ops.aten.rsqrt.default(x)")),
    ("torch-compute", "matmul-operator", entry_with("z = x @ weight")),
    ("torch-compute", "stored-reference", "FNS = (torch.rsqrt,)\n" + HONEST_ENTRY),
    ("torch-compute", "module-as-value", "def entry(x, *, weight, eps, t=torch):\n    return t.rsqrt(x)\n"),
    ("torch-compute", "tensor-method", entry_with("z = x.float().pow(2).mean(-1)")),
    ("torch-compute", "unbound-tensor-method", entry_with("z = torch.Tensor.mean(x)")),
    ("torch-compute", "getattr-method", entry_with('z = getattr(x, "mean")()')),
    ("torch-compute", "operator-on-tensor", entry_with(ret="y.view(x.shape) + x")),
    ("torch-compute", "scaled-return", entry_with(ret="y.view(x.shape) * 1")),
    ("torch-compute", "negation", entry_with("z = -weight")),
    ("torch-compute", "augmented", entry_with("y += 0")),
    ("torch-compute", "builtin-on-tensor", entry_with("z = sum(x)")),
    ("torch-compute", "helper-taint", "def _double(t):\n    return t * 2\n" + entry_with("z = _double(weight)")),
    (
        "torch-compute",
        "inside-kernel",
        """
@triton.jit
def _k(X, BLOCK: tl.constexpr):
    v = torch.exp(tl.load(X + tl.arange(0, BLOCK)))
"""
        + entry_with("_k[(1,)](x2, BLOCK=16)"),
    ),
    # compile / capture
    ("torch-compile", "compile", entry_with("f = torch.compile(entry)")),
    ("torch-compile", "dynamo", entry_with("torch._dynamo.reset()")),
    ("torch-compile", "jit-script", entry_with("f = torch.jit.script(entry)")),
    ("torch-compile", "cuda-graph", entry_with("g = torch.cuda.CUDAGraph()")),
    # threads, processes, streams
    ("concurrency", "side-stream", entry_with("s = torch.cuda.Stream()")),
    ("concurrency", "stream-context", entry_with("c = torch.cuda.stream(None)")),
    ("concurrency", "multiprocessing", entry_with("p = torch.multiprocessing.Process()")),
    ("concurrency", "async", "async def helper():\n    return 1\n" + HONEST_ENTRY),
    # native code
    ("native-code", "inline-cuda", entry_with('m = torch.utils.cpp_extension.load_inline("m", "")')),
    ("native-code", "custom-op", entry_with('lib = torch.library.Library("x", "DEF")')),
    # private internals
    ("private-api", "torch-C", entry_with("c = torch._C._get_tracing_state()")),
    ("private-api", "triton-C", entry_with("c = triton._C")),
    ("private-api", "underscore-attr", entry_with("b = x._base")),
    # reads of frames, globals, gc
    ("introspection", "globals", entry_with("g = globals()")),
    ("introspection", "vars", entry_with("g = vars()")),
    ("introspection", "dunder-globals", entry_with("g = entry.__globals__")),
    ("introspection", "dunder-class", entry_with("c = x.__class__")),
    ("introspection", "frame", entry_with("f = (lambda: 0).f_back")),
    ("introspection", "computed-getattr", entry_with('name = "rs" + "qrt"', "f = getattr(torch, name)")),
    ("introspection", "builtins-name", entry_with("b = __builtins__")),
    ("introspection", "kernel-internals", entry_with("src = _rms_rows.fn")),
    # code the checker cannot see
    ("dynamic-code", "eval", entry_with('eval("1")')),
    ("dynamic-code", "exec", entry_with('exec("z = 1")')),
    ("dynamic-code", "dunder-import", entry_with('m = __import__("os")')),
    ("dynamic-code", "compile", entry_with('c = compile("1", "f", "eval")')),
    ("dynamic-code", "type-3", entry_with('T = type("T", (), {})')),
    # file access
    ("file-io", "open", entry_with('data = open("/tmp/reference.pt", "rb")')),
    ("file-io", "input", entry_with("s = input()")),
    # assignment into torch / triton / math / builtins
    ("monkeypatch", "torch-attr", entry_with("torch.rsqrt = None")),
    ("monkeypatch", "tensor-method", "torch.Tensor.add = None\n" + HONEST_ENTRY),
    ("monkeypatch", "triton-language", "tl.sum = None\n" + HONEST_ENTRY),
    ("monkeypatch", "triton", entry_with("triton.jit = None")),
    ("monkeypatch", "math", "import math\nmath.pi = 3\n" + HONEST_ENTRY),
    ("monkeypatch", "setattr-module", entry_with('setattr(torch, "allclose", None)')),
    ("monkeypatch", "del-module-attr", entry_with("del torch.allclose")),
    ("monkeypatch", "builtins-dict", entry_with('__builtins__["len"] = None')),
    ("monkeypatch", "shadow-builtin", "len = None\n" + HONEST_ENTRY),
    ("monkeypatch", "rebind-module-name", "torch = None\n" + HONEST_ENTRY),
    # leaving early
    ("process-exit", "exit", entry_with("exit(0)")),
    ("process-exit", "quit", entry_with("quit()")),
    ("process-exit", "system-exit", entry_with("raise SystemExit(0)")),
    ("process-exit", "keyboard-interrupt", entry_with("raise KeyboardInterrupt")),
    # try/except fallbacks
    ("try-except", "except", entry_with("try:", "    pass", "except Exception:", "    pass")),
    ("try-except", "finally", entry_with("try:", "    pass", "finally:", "    pass")),
    # shape- or dtype-guarded fallbacks
    ("guarded-fallback", "shape-identity", entry_with("if x.shape[0] == 1:", "    return x")),
    ("guarded-fallback", "dtype-fallback", entry_with("if x.dtype == torch.bfloat16:", "    return y")),
    ("guarded-fallback", "derived-size", entry_with("rows = x2.shape[0]", "if rows < 2:", "    return x2")),
    (
        "guarded-fallback",
        "guarded-launch-skip",
        """
def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0] > 1:
        _rms_rows[(x2.shape[0],)](x2, weight, y, hidden, eps, BLOCK=triton.next_power_of_2(hidden))
    return y.view(x.shape)
""",
    ),
    ("guarded-fallback", "ifexp-return", entry_with(ret="y if x.dim() == 2 else x")),
    # decoy kernels
    ("kernel-not-launched", "decoy", "@triton.jit\ndef _decoy(X):\n    pass\n" + HONEST_ENTRY),
    ("kernel-not-launched", "never-launches", "def entry(x, *, weight, eps):\n    return torch.empty_like(x)\n"),
    (
        "kernel-not-launched",
        "no-kernels-at-all",
        "import torch\nOP = 'rms_norm'\nADAPTER = []\ndef entry(x, *, weight, eps):\n    return torch.empty_like(x)\n",
    ),
    (
        "kernel-not-launched",
        "launch-in-unreachable-helper",
        "def _unused(x2, w, y):\n    _rms_rows[(1,)](x2, w, y, 1, 1e-6, BLOCK=1)\n"
        "def entry(x, *, weight, eps):\n    return torch.empty_like(x)\n",
    ),
    (
        "kernel-not-launched",
        "unguarded-skip",
        """
def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    if eps > 1e-5:
        _rms_rows[(x2.shape[0],)](x2, weight, y, hidden, eps, BLOCK=triton.next_power_of_2(hidden))
    return y.view(x.shape)
""",
    ),
    # returned value not produced by the launch
    ("return-not-from-kernel", "returns-input", entry_with(ret="x")),
    ("return-not-from-kernel", "returns-unlaunched-buffer", entry_with("z = torch.empty_like(x)", ret="z")),
    ("return-not-from-kernel", "returns-weight", entry_with(ret="weight")),
    # host code inside kernels
    (
        "kernel-host-code",
        "calls-host-helper",
        """
def _host(v):
    return v

@triton.jit
def _k(X, BLOCK: tl.constexpr):
    v = _host(tl.load(X + tl.arange(0, BLOCK)))
"""
        + entry_with("_k[(1,)](x2, BLOCK=16)"),
    ),
    ("kernel-host-code", "kernel-called-directly", entry_with("_rms_rows(x2, weight, y, hidden, eps, 16)")),
    (
        "kernel-host-code",
        "nested-kernel",
        """
def entry(x, *, weight, eps):
    @triton.jit
    def _inner(X):
        pass
    hidden = x.shape[-1]
    y = torch.empty_like(x)
    _rms_rows[(1,)](x, weight, y, hidden, eps, BLOCK=16)
    return y
""",
    ),
    (
        "kernel-host-code",
        "kernel-reads-mutable-global",
        """
TABLE = [1.0, 2.0]

@triton.jit
def _k(X, BLOCK: tl.constexpr):
    v = TABLE
"""
        + entry_with("_k[(1,)](x2, BLOCK=16)"),
    ),
    # module-level mutable caches and other state between calls
    ("mutable-state", "dict-cache", "_CACHE = {}\n" + entry_with("_CACHE[hidden] = y")),
    ("mutable-state", "list-append", "_SEEN = []\n" + entry_with("_SEEN.append(y)")),
    ("mutable-state", "global", "_LAST = None\n" + entry_with("global _LAST", "_LAST = y")),
    (
        "mutable-state",
        "closure",
        """
def _make():
    cache = {}
    def entry(x, *, weight, eps):
        cache["y"] = x
        return x
    return entry
"""
        + HONEST_ENTRY,
    ),
    ("mutable-state", "mutable-default", HONEST_ENTRY.replace("eps):", "eps, _memo={}):")),
    ("mutable-state", "class", "class Holder:\n    value = None\n" + HONEST_ENTRY),
    ("mutable-state", "function-attribute", entry_with("entry.last = y")),
    ("mutable-state", "tensor-attribute", entry_with("weight.cached = y")),
    ("mutable-state", "module-tensor", "_BUF = torch.empty(1 << 20)\n" + HONEST_ENTRY),
    ("mutable-state", "setattr-object", entry_with('setattr(weight, "cached", y)')),
    # code at import time
    ("import-time-code", "module-call", 'print("hello")\n' + HONEST_ENTRY),
    ("import-time-code", "module-loop", "for _i in range(3):\n    pass\n" + HONEST_ENTRY),
    ("import-time-code", "module-if", "if True:\n    BLOCK = 4\n" + HONEST_ENTRY),
    ("import-time-code", "entry-decorator", "def _wrap(f):\n    return f\n@_wrap" + HONEST_ENTRY),
    ("import-time-code", "annotation-call", "def entry(x: print('hi'), *, weight, eps):\n    return x\n"),
    # unparsable
    ("syntax-error", "syntax", "def entry(x, *, weight, eps)\n    return x\n"),
    # read otherwise by Python than by the checker (coding declarations: test_isolation.py)
    ("source-encoding", "form-feed", "\x0c" + HONEST_ENTRY),
]


@pytest.mark.parametrize("rule,case,code", CHEATS, ids=[f"{r}:{c}" for r, c, _ in CHEATS])
def test_static_rule_catches_cheat(rule, case, code):
    assert rule in static_rules(HEADER + "\n" + code)


def test_every_static_rule_has_a_cheat():
    static = {name for name, rule in RULES.items() if rule.layer == "static" and name != "unreadable"}
    assert static <= {rule for rule, _, _ in CHEATS}


HONEST_SNIPPETS = {
    "plain": HONEST_ENTRY,
    "isinstance-and-raise": entry_with(
        "if not isinstance(x, torch.Tensor):", "    raise TypeError('x must be a tensor')"
    ),
    "annotations-typing": "from typing import Optional\n"
    + HONEST_ENTRY.replace(
        "def entry(x, *, weight, eps):",
        "def entry(x: torch.Tensor, *, weight: torch.Tensor, eps: float) -> Optional[torch.Tensor]:",
    ),
    "math-and-constants": "import math\nBLOCKS = (64, 128)\nSCALE = math.sqrt(2.0)\n"
    + entry_with("b = BLOCKS[0]", "n = math.ceil(hidden / b)"),
    "grid-lambda": """
def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    grid = lambda meta: (triton.cdiv(x2.shape[0], meta["ROWS"]),)
    _rms_rows[grid](x2, weight, y, hidden, eps, BLOCK=triton.next_power_of_2(hidden), ROWS=1)
    return y.view(x.shape)
""",
    "main-guard-ignored": HONEST_ENTRY
    + """
if __name__ == "__main__":
    import os
    x = torch.randn(4, 64)
    print(torch.allclose(entry(x, weight=torch.ones(64), eps=1e-6), x))
""",
    "two-kernels-by-width": """
@triton.jit
def _rms_wide(X, W, Y, n_cols, eps, BLOCK: tl.constexpr):
    pass

def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    block = triton.next_power_of_2(hidden)
    if block <= 8192:
        _rms_rows[(x2.shape[0],)](x2, weight, y, hidden, eps, BLOCK=block)
    else:
        _rms_wide[(x2.shape[0],)](x2, weight, y, hidden, eps, BLOCK=8192)
    return y.reshape(x.shape)
""",
    "libdevice-and-device-function": """
from triton.language.extra import libdevice

@triton.jit
def _sq(v):
    return v * v

@triton.jit
def _k(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, libdevice.tanh(_sq(tl.load(X + offs))))
"""
    + entry_with("_k[(1,)](x2, y, BLOCK=16)"),
    "autotune-configs": """
CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 128}, num_warps=4)]

@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def _k(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)
"""
    + entry_with("_k[(1,)](x2, y, x2.numel())"),
    "device-properties": entry_with(
        "sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1"
    ),
}


@pytest.mark.parametrize("name", sorted(HONEST_SNIPPETS))
def test_honest_code_passes(name):
    assert static_rules(HEADER + "\n" + HONEST_SNIPPETS[name]) == set()


TEMPLATES = sorted(
    p for p in (Path(__file__).parents[2] / "gpuyantra" / "kernels").glob("*.py") if p.name != "__init__.py"
)


@pytest.mark.parametrize("path", TEMPLATES + sorted(CANDIDATES.glob("honest_*.py")), ids=lambda p: p.stem)
def test_project_templates_and_honest_candidates_pass(path):
    source = path.read_text()
    report = check_source(source, str(path), get_op(_op_of(source)))
    assert report.failures == []
    assert report.op and report.entry is not None and report.kernels


def _op_of(source: str) -> str:
    from gpuyantra.candidate import read_op

    return read_op(source)


def test_reads_contract_literals_without_running_anything():
    report = check_source(HEADER + HONEST_ENTRY, "<test>", RMS)
    assert report.op == "rms_norm"
    assert report.adapter == [
        {"kernel_param": "weight", "module_attr": "weight"},
        {"kernel_param": "eps", "module_attr": "variance_epsilon"},
    ]
    assert report.entry.positional == ["x"] and report.entry.kwonly == ["weight", "eps"]
    assert report.kernels == ["_rms_rows"]


def test_messages_name_the_line():
    report = check_source(HEADER + entry_with("z = torch.rsqrt(x)"), "<test>", RMS)
    failure = next(f for f in report.failures if f.rule == "torch-compute")
    assert failure.message.startswith("line ") and "torch.rsqrt" in failure.message
