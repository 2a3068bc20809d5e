"""The names the static rules judge against: which modules a candidate may import, which torch
attributes host code may touch (allocation and metadata), which tensor methods compute, and which
builtins, attributes and call paths are forbidden or allowed in each context.

Kept apart from the rules so the allowlists read as one table; the rules modules import from here.
"""

from __future__ import annotations

import builtins

import torch

from gpuyantra.ops.open.library import ENTRY_POINTS

ALLOWED_MODULES = frozenset({"torch", "triton", "triton.language", "math", "typing", "__future__"})
ALLOWED_MODULE_PREFIXES = ("triton.language.",)

# Constants: dtypes, memory formats and layouts (torch.float16, torch.contiguous_format, torch.strided).
TORCH_DTYPES = frozenset(
    f"torch.{name}"
    for name in dir(torch)
    if isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format, torch.layout))
)
# Torch attributes host code may use: allocation and metadata, nothing that computes.
ALLOWED_TORCH = (
    frozenset(
        {
            "torch.empty",
            "torch.empty_like",
            "torch.empty_strided",
            "torch.zeros",
            "torch.zeros_like",
            "torch.promote_types",
            "torch.result_type",
            "torch.is_tensor",
            "torch.is_floating_point",
            "torch.finfo",
            "torch.iinfo",
            "torch.get_default_dtype",
            "torch.device",
            "torch.Size",
            "torch.dtype",
            "torch.no_grad",
            "torch.inference_mode",
            "torch.cuda.is_available",
            "torch.cuda.current_device",
            "torch.cuda.device_count",
            "torch.cuda.get_device_properties",
            "torch.cuda.get_device_capability",
            "torch.cuda.get_device_name",
            "torch.version.cuda",  # strings: which backend the build targets (CUDA or ROCm)
            "torch.version.hip",
        }
    )
    | TORCH_DTYPES
)
# Library primitives (convolution, GEMM, attention) an open target's candidate may call where its
# own forward computes that kind (gpuyantra/ops/open/library.py): dotted path -> kind.
LIBRARY_CALLS: dict[str, str] = dict(ENTRY_POINTS)
TORCH_ALLOC = frozenset({"torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like"})

COMPILE_PREFIXES = (
    "torch.compile",
    "torch.compiler",
    "torch._dynamo",
    "torch._inductor",
    "torch.jit",
    "torch.fx",
    "torch.export",
    "torch.cuda.graph",
    "torch.cuda.graphs",
    "torch.cuda.CUDAGraph",
    "torch.cuda.make_graphed_callables",
)
CONCURRENCY_PREFIXES = (
    "torch.cuda.Stream",
    "torch.cuda.stream",
    "torch.cuda.streams",
    "torch.cuda.current_stream",
    "torch.cuda.default_stream",
    "torch.cuda.set_stream",
    "torch.cuda.Event",
    "torch.cuda.ExternalStream",
    "torch.cuda.StreamContext",
    "torch.cuda.synchronize",
    "torch.Stream",
    "torch.Event",
    "torch.accelerator",
    "torch.multiprocessing",
    "torch.distributed",
    "torch.futures",
    "torch.set_num_threads",
    "torch.set_num_interop_threads",
)
NATIVE_PREFIXES = (
    "torch.utils.cpp_extension",
    "torch.library",
    "torch.cuda.jiterator",
    "torch.classes",
    "torch.utils.dlpack",
    "torch.from_dlpack",
    "torch.cuda.nvtx",
)

# Tensor methods host code may call: shape/stride metadata, views, allocation, dtype conversion.
TENSOR_SAFE_METHODS = frozenset(
    {
        "shape",
        "size",
        "stride",
        "dim",
        "ndim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "itemsize",
        "nbytes",
        "dtype",
        "device",
        "layout",
        "is_contiguous",
        "contiguous",
        "data_ptr",
        "const_data_ptr",
        "storage_offset",
        "get_device",
        "dim_order",
        "requires_grad",
        "is_leaf",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "flatten",
        "unflatten",
        "ravel",
        "unsqueeze",
        "squeeze",
        "expand",
        "expand_as",
        "permute",
        "transpose",
        "t",
        "T",
        "mT",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "narrow",
        "select",
        "unbind",
        "split",
        "split_with_sizes",
        "chunk",
        "tensor_split",
        "unsafe_chunk",
        "unsafe_split",
        "as_strided",
        "detach",
        "clone",
        "copy_",
        "zero_",
        "fill_",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "int",
        "long",
        "short",
        "char",
        "byte",
        "bool",
        "cuda",
        "item",
        "type",
        "data",
        # Names Python containers and strings share with Tensor; too common to forbid by name alone.
        "index",
        "values",
        "indices",
        "name",
    }
) | frozenset(n for n in dir(torch.Tensor) if n.startswith("is_"))
TENSOR_COMPUTE_METHODS = frozenset(n for n in dir(torch.Tensor) if not n.startswith("_")) - TENSOR_SAFE_METHODS
# Methods that return a tensor when called on one (taint propagation for operator checks).
TENSOR_RETURNING = (
    frozenset(
        {
            "view",
            "view_as",
            "reshape",
            "reshape_as",
            "flatten",
            "unflatten",
            "ravel",
            "unsqueeze",
            "squeeze",
            "expand",
            "expand_as",
            "permute",
            "transpose",
            "t",
            "movedim",
            "moveaxis",
            "swapaxes",
            "swapdims",
            "narrow",
            "select",
            "as_strided",
            "detach",
            "clone",
            "copy_",
            "zero_",
            "fill_",
            "new_empty",
            "new_empty_strided",
            "new_zeros",
            "to",
            "float",
            "half",
            "bfloat16",
            "double",
            "int",
            "long",
            "short",
            "char",
            "byte",
            "bool",
            "cuda",
            "contiguous",
            "data",
        }
    )
    | TENSOR_COMPUTE_METHODS
)
TENSOR_SEQUENCE_METHODS = frozenset(
    {"unbind", "split", "split_with_sizes", "chunk", "tensor_split", "unsafe_chunk", "unsafe_split"}
)
TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "data", "real", "imag", "grad"})
# Attributes whose value says something about shape, dtype or placement (guards).
SHAPE_ATTRS = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "is_cuda",
        "is_cpu",
        "layout",
        "is_contiguous",
        "stride",
        "size",
        "numel",
        "dim",
        "element_size",
        "nelement",
        "ndimension",
        "is_floating_point",
        "itemsize",
        "nbytes",
        "data_ptr",
        "storage_offset",
        "is_meta",
    }
)
FRAME_ATTRS = frozenset(
    {
        "f_back",
        "f_globals",
        "f_locals",
        "f_code",
        "f_builtins",
        "f_lasti",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
        "co_names",
        "func_globals",
        "im_func",
        "im_self",
    }
)
MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "update",
        "setdefault",
        "pop",
        "popitem",
        "clear",
        "add",
        "remove",
        "discard",
        "sort",
        "reverse",
        "copy_",
        "fill_",
        "zero_",
    }
)

DYNAMIC_CODE_BUILTINS = frozenset({"eval", "exec", "compile", "__import__"})
INTROSPECTION_BUILTINS = frozenset({"globals", "locals", "vars", "dir"})
FILE_IO_BUILTINS = frozenset({"open", "input", "breakpoint", "help"})
EXIT_BUILTINS = frozenset({"exit", "quit"})
EXIT_EXCEPTIONS = frozenset({"SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException"})
TENSOR_BUILTINS = frozenset({"abs", "sum", "max", "min", "pow", "round", "divmod", "sorted", "any", "all"})
JIT_BUILTINS = frozenset(
    {
        "range",
        "min",
        "max",
        "print",
        "int",
        "float",
        "bool",
        "len",
        "abs",
        "isinstance",
        "tuple",
        "enumerate",
        "zip",
        "True",
        "False",
        "None",
    }
)
# Calls allowed while the module is imported (decorators, constants).
IMPORT_TIME_CALLS = frozenset(
    {
        "triton.jit",
        "triton.autotune",
        "triton.heuristics",
        "triton.Config",
        "triton.next_power_of_2",
        "triton.cdiv",
        "triton.language.constexpr",
        "torch.finfo",
        "torch.iinfo",
        "torch.device",
        "torch.Size",
        "torch.promote_types",
        "torch.get_default_dtype",
        "torch.no_grad",
        "torch.inference_mode",
    }
)
IMPORT_TIME_BUILTINS = frozenset(
    {
        "int",
        "float",
        "bool",
        "str",
        "min",
        "max",
        "abs",
        "round",
        "len",
        "tuple",
        "range",
        "dict",
        "list",
        "set",
        "frozenset",
        "sorted",
        "zip",
        "enumerate",
        "isinstance",
    }
)
KERNEL_ATTRS = frozenset({"run", "warmup", "best_config", "configs"})
HOST_DECORATORS = frozenset({"torch.no_grad", "torch.inference_mode"})
BUILTIN_NAMES = frozenset(dir(builtins))
