"""The open author computes as PyTorch computes on the GPU: transcendental functions through
libdevice (CUDA's own expf, cosf, ...: not Triton's ex2.approx exp, sqrt.approx sqrt or div.full
division), IEEE division and square roots, no FMA contraction and no flush-to-zero, and in Triton's
CPU interpreter (no libdevice) float64 forms rounded once. A rotary embedding (Qwen2's, and the
older matmul spelling) written by the author reproduces the module's float32 angles bit for bit
and rounds their cosine and sine correctly, over positions 0..4096; the GPU branch of the file
compiles (for sm_90, no GPU needed) to PTX without approximate or flushed arithmetic.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from gpuyantra.authors.opengen import OpenSpec, write_open_source
from gpuyantra.authors.opengen.ops import Operand, pointwise
from gpuyantra.verifier.static import check_source
from tests.authors.test_opengen import Model, _auto_spec, _kwargs, _load

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# Triton spellings that are not what torch computes on CUDA: approximate (tl.exp, tl.exp2, tl.sqrt)
# or libdevice behind a flush-to-zero link (tl.sin, tl.cos, tl.log, ...).
TRITON_MATH = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "erf"}
LIBDEVICE_OPS = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "rsqrt", "sin", "cos", "tan", "erf", "erfc",
    "tanh", "sinh", "cosh", "pow",
)  # fmt: skip
HEAD_DIM, THETA, POSITIONS = 128, 1e6, 4097


def _libm_chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = torch.exp(x) + torch.exp2(x) + torch.expm1(x) + torch.log(y) + torch.log2(y) + torch.log10(y)
    b = torch.log1p(y) + torch.rsqrt(y) + torch.sin(x) + torch.cos(x) + torch.tan(x) + torch.erf(x)
    c = torch.erfc(x) + torch.tanh(x) + torch.sinh(x) + torch.cosh(x) + torch.pow(y, x) + torch.sigmoid(x)
    return a + b + c + torch.sqrt(y) + x / y + x / 3.0


def _positive(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def _kernel_functions(source: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(source)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _calls(node: ast.AST) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}


def test_generated_math_calls_libdevice_divides_and_roots_exactly(tmp_path: Path) -> None:
    x, y = torch.randn(4, 19), _positive(4, 19)
    spec = _auto_spec(Model(_libm_chain), [x, y])
    source = write_open_source(spec)
    assert not check_source(source, "candidate.py", None).failures
    assert "from triton.language.extra import libdevice" in source
    functions = _kernel_functions(source)
    kernels = [f for name, f in functions.items() if name.startswith("_k")]
    assert kernels
    for kernel in kernels:
        calls = _calls(kernel)
        assert not {f"tl.{fn}" for fn in TRITON_MATH} & calls, ast.unparse(kernel)
        assert "tl.div_rn" in calls and "tl.sqrt_rn" in calls
        divisions = [n for n in ast.walk(kernel) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)]
        assert not divisions, [ast.unparse(d) for d in divisions]  # div.full on NVIDIA
        assert any(a.arg == "LIBDEVICE" for a in kernel.args.args)
    for op in LIBDEVICE_OPS:
        helper = functions[f"_acc_{op}"]
        branch = next(n for n in ast.walk(helper) if isinstance(n, ast.If))
        assert ast.unparse(branch.test) == "LIBDEVICE"
        assert f"libdevice.{op}" in _calls(ast.Module(body=branch.body, type_ignores=[]))
    assert "LIBDEVICE=_dev.type == 'cuda'" in source and "**_exact" in source
    # A division by a number multiplies by its reciprocal (computed in double, then float32), as
    # ATen's div kernel does with a CPU scalar; 1 / 3 rounds to 0.3333333432674408 in float32.
    assert "* 0.3333333432674408)" in source
    # And in the interpreter (CPU tensors) the file runs, without libdevice.
    candidate = _load(source, tmp_path)
    assert candidate._numerics(torch.device("cpu"), False) == {"enable_fp_fusion": False}
    got = candidate.entry(x, y, **_kwargs(spec, spec.module))
    torch.testing.assert_close(got, _libm_chain(x.double(), y.double()).float(), rtol=1e-5, atol=1e-5)


def test_division_forms() -> None:
    tensor, other = Operand("a", "f", True), Operand("b", "f", True)
    assert pointwise("div", [tensor, other], "f") == ("tl.div_rn(a, b)", ())
    assert pointwise("div", [tensor, Operand("4.0", "f", False)], "f") == ("(a * 0.25)", ())
    scalar_arg = Operand("f_scale", "f", False)
    assert pointwise("div", [tensor, scalar_arg], "f")[0] == "(a * tl.div_rn(1.0, tl.full([], f_scale, tl.float32)))"
    assert pointwise("div", [tensor, Operand("0.0", "f", False)], "f")[0].startswith("tl.div_rn(a,")
    assert pointwise("reciprocal", [tensor], "f")[0] == "tl.div_rn(1.0, a)"
    assert pointwise("sqrt", [tensor], "f")[0] == "tl.sqrt_rn(a)"


# --------------------------------------------------------------------------------------------- rotary


class MatmulRotaryEmbedding(nn.Module):
    """Qwen2RotaryEmbedding.forward as transformers wrote it before 5.2x: a float32 matmul of the
    inverse frequencies by the positions, autocast off."""

    def __init__(self, dim: int = HEAD_DIM, base: float = THETA):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.attention_scaling
            sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _qwen2_rotary() -> nn.Module:
    import transformers
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    config = transformers.Qwen2Config(
        hidden_size=2 * HEAD_DIM, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
        num_hidden_layers=1, vocab_size=100, rope_theta=THETA, max_position_embeddings=8192,
    )  # fmt: skip
    return Qwen2RotaryEmbedding(config).eval()


def _rotary_spec(module: nn.Module) -> OpenSpec:
    from gpuyantra.authors.open_author import spec_from_target
    from gpuyantra.ops.open import build_open_target

    x = torch.randn(1, 8, 2 * HEAD_DIM, dtype=torch.bfloat16)
    target = build_open_target(module, (x, torch.arange(8)[None]), name_hint="rotary")
    return spec_from_target(target)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


@pytest.mark.parametrize("make", [_qwen2_rotary, MatmulRotaryEmbedding], ids=["qwen2", "matmul_form"])
def test_rotary_embedding_is_the_float32_reference_rounded_once(make, tmp_path: Path) -> None:
    module = make()
    spec = _rotary_spec(module)
    source = write_open_source(spec)
    assert not check_source(source, "candidate.py", None).failures
    candidate = _load(source, tmp_path)
    positions = torch.arange(POSITIONS)[None]
    x = torch.zeros(1, POSITIONS, 2 * HEAD_DIM)  # float32 outputs: the values before any cast
    cos, sin = candidate.entry(x, positions, **_kwargs(spec, module))
    with torch.no_grad():
        ref_cos, ref_sin = module(x, positions)
    # The module's own float32 angles (exact products: position * inv_freq rounded once).
    freqs = positions[..., None].float() * module.inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1).double()
    assert cos.dtype == torch.float32 and cos.shape == ref_cos.shape == emb.shape
    # Bit for bit the correctly rounded cosine and sine of those angles (torch's CPU cos, SLEEF,
    # is within one ulp of it and so is CUDA's cosf: the GPU branch calls that one, see below).
    assert torch.equal(cos, torch.cos(emb).float()), int((cos != torch.cos(emb).float()).sum())
    assert torch.equal(sin, torch.sin(emb).float()), int((sin != torch.sin(emb).float()).sum())
    assert int(_ulps(cos, ref_cos).max()) <= 1 and int(_ulps(sin, ref_sin).max()) <= 1


# A child process without the interpreter compiles the candidate's GPU branch for sm_90 (Triton's
# wheel carries the NVIDIA backend; no GPU is needed to reach PTX).
_COMPILE = textwrap.dedent(
    """
    import importlib.util, inspect, re, sys, types
    import triton
    from triton.backends.compiler import GPUTarget
    spec = importlib.util.spec_from_file_location("candidate", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = getattr(module, sys.argv[2])
    pointers = dict(arg.split("=") for arg in sys.argv[3:])
    values = {"LIBDEVICE": True, "ROWS": 1, "BLOCK": 1024, "I64": False}
    signature, constexprs = {}, {}
    for i, (name, p) in enumerate(inspect.signature(kernel.fn).parameters.items()):
        if "constexpr" in str(p.annotation):
            signature[name], constexprs[(i,)] = "constexpr", values.get(name, name.startswith("C_"))
        elif name.startswith("p_"):
            signature[name] = pointers.get(name, "*fp32")
        else:
            signature[name] = "fp32" if name.startswith("f_") else "i32"
    class Driver:  # an NVIDIA driver for the file's own choice of launch options
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    triton.runtime.driver.set_active(Driver())
    options = module._numerics(types.SimpleNamespace(type="cuda"), False)
    print("options", sorted(options.items()), file=sys.stderr)
    compiled = triton.compile(
        triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
        target=GPUTarget("cuda", 90, 32), options=options,
    )
    ops = sorted(set(re.findall(r"^\\s*([a-z][a-z0-9_.]*)\\s", compiled.asm["ptx"], re.M)))
    print(" ".join(ops))
    """
)


def _ptx_ops(source: str, kernel: str, tmp_path: Path, **pointers: str) -> set[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "gpu_candidate.py"
    path.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    args = [f"{k}={v}" for k, v in pointers.items()]
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE, str(path), kernel, *args],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return set(done.stdout.split())


def test_gpu_branch_compiles_to_exact_ptx(tmp_path: Path) -> None:
    # The rotary kernel: libdevice's cosf/sinf without flush-to-zero, nothing approximate.
    source = write_open_source(_rotary_spec(_qwen2_rotary()))
    ops = _ptx_ops(source, "_k0", tmp_path, p_position_ids="*i64")
    assert not [op for op in ops if ".ftz" in op or ".approx" in op], sorted(ops)
    assert "cvt.rni.s32.f32" in ops  # cosf's argument reduction: the libdevice body is inlined
    # Elementwise arithmetic: IEEE division and square root, a product and a sum rounded apart.
    module = Model(lambda x, y, z: torch.sqrt(x.abs()) + x * y + z / y)
    spec = _auto_spec(module, [torch.randn(4, 19), _positive(4, 19), torch.randn(4, 19)])
    ops = _ptx_ops(write_open_source(spec), "_k0", tmp_path / "arith")
    assert {"div.rn.f32", "sqrt.rn.f32", "mul.rn.f32", "add.rn.f32"} <= ops, sorted(ops)
    assert not [op for op in ops if op.startswith(("fma", "div.full", "sqrt.approx"))], sorted(ops)
