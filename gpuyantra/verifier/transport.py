"""How the outputs of checked calls travel from the sandbox child to the parent.

Every chunk file the child writes (`child.OutputSink`, read by `sandbox.OutputReader`) names its
transport, and the parent dispatches on it:

- `host`: `{"transport": "host", "outputs": {"case:index": tensor}, "fallback": reason or None}`.
  The tensors themselves, copied to the host: CPU runs, and CUDA runs where CUDA IPC failed
  (`fallback` then says why, in one line).
- `cuda_ipc`: `{"transport": "cuda_ipc", "outputs": {"case:index": entry}}`. The child copies the
  chunk's outputs into one buffer on the GPU and exports it once with CUDA IPC (`export_cuda_ipc`);
  each entry describes one output's place in that buffer (every entry names the same handle), and
  the file carries only those descriptions. The child keeps the buffer alive until the parent has
  deleted the chunk file. The parent maps each storage the entries name once, copies it into its own
  GPU memory (`receive_cuda_ipc`) and queues its judging behind the copy; it waits once for both,
  unmaps the storage and only then deletes the file, so nothing the child does afterwards (exit,
  crash, writes) changes what is judged, and the child's wait for the file to go (`drain`) ends
  with the parent's GPU work on it. Where that fails
  the parent leaves a `nack-NNNNNN` file beside the chunk before deleting it, and the child sends the
  same outputs again as a `host` chunk.

The child is untrusted: the candidate runs in it and can write any chunk. An entry is only ever
data: the parent checks every field (`validate_chunk`: types, a dtype from an allowlist, sizes
within the output budget, the view inside the storage, the device the parent judges on, a handle
of a plain `cudaMalloc` block, a reference counter of the child's own) before torch maps anything,
and checks the mapping's real size before reading from it.

An entry holds only str, int and lists of ints (the handle and the reference counter as lowercase
hex), and the child writes a `cuda_ipc` chunk as JSON: the parent parses it in C, without running
anything from it (`host` chunks, tensors, go by torch.save and load under weights_only).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

HOST = "host"
CUDA_IPC = "cuda_ipc"
TRANSPORTS = (CUDA_IPC, HOST)
NACK_PREFIX = "nack-"

# What an output may be to travel by CUDA IPC, with its bytes per element; anything else goes by the host.
_ITEM_SIZE = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
}
DTYPE_NAMES = frozenset(_ITEM_SIZE)
ENTRY_KEYS = frozenset(
    {
        "dtype",
        "shape",
        "stride",
        "offset",  # elements, the view's offset in its storage
        "device",
        "handle",  # lowercase hex, as every bytes field: see the module's docstring
        "storage_bytes",
        "storage_offset_bytes",  # the storage's offset in the allocation the handle maps
        "ref_counter",
        "ref_counter_offset",
    }
)
MAX_DIMS = 32
MAX_ENTRIES = 2**16
# The caching allocator's handle of a block: a version byte, the type byte `c` (a plain cudaMalloc
# allocation; `e`, an expandable segment, would make the parent fetch a file descriptor from the
# process the handle names) and the 64-byte cudaIpcMemHandle_t.
IPC_HANDLE_BYTES = 2 + 64
IPC_HANDLE_TYPE = ord("c")
REF_COUNTER_SLOTS = 10000  # torch::CUDA_IPC_REF_COUNTER_FILE_SIZE: int64 counters per shared file
MAX_REF_COUNTER_BYTES = 256  # the name of a shared-memory file
# torch's reference-counter files are named `/torch_<pid>_<random>_<counter>` (older: no random part).
_REF_COUNTER = re.compile(rb"/torch_(\d+)_\d+(?:_\d+)?")
_NO_EVENT = bytes(64)  # the child synchronizes before it writes the chunk: no IPC event to wait on
_HEX = re.compile(r"(?:[0-9a-f]{2})*")

T = TypeVar("T")


def nack_name(sequence: int) -> str:
    return f"{NACK_PREFIX}{sequence:06d}"


def one_line(text: str, limit: int = 300) -> str:
    """A reason as one line of at most `limit` characters."""
    return " ".join(str(text).split())[:limit]


def choose_transport(device: str, export: Callable[[], T]) -> tuple[str, T | None, str | None]:
    """(transport, what `export` returned, why not CUDA IPC): `cuda_ipc` where the outputs are on a
    CUDA device and exporting them worked; `host` otherwise, with the one-line reason where the
    export was tried and raised (on the CPU there is nothing to fall back from: no reason)."""
    if device != "cuda":
        return HOST, None, None
    try:
        return CUDA_IPC, export(), None
    except Exception as exc:  # noqa: BLE001 - any failure to export: the host path still works
        return HOST, None, one_line(f"cuda_ipc export failed: {type(exc).__name__}: {exc}")


# Each output's place in a chunk's buffer starts on this many bytes: a multiple of every item size,
# and of the 128-byte lines the judging kernel reads.
PACK_ALIGN = 256


def pack_outputs(outputs: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(buffer, views): the outputs copied, contiguous, into one new byte buffer on their device,
    each at a PACK_ALIGN-aligned place; `views` are those places as tensors of the outputs' dtypes
    and shapes (child side). One allocation per chunk: the parent maps and copies it once, where one
    handle per output cost it a mapping, a reference counter and a copy each (six verifications at
    once spent 0.54-0.82 s of each verdict receiving outputs, 0.05-0.07 s alone)."""
    import torch

    devices = {t.device for t in outputs.values()}
    if len(devices) > 1:
        raise ValueError(f"outputs on {len(devices)} devices do not share one buffer")
    places: dict[str, int] = {}
    total = 0
    for key, t in outputs.items():
        places[key] = total
        total += -(-t.numel() * t.element_size() // PACK_ALIGN) * PACK_ALIGN
    device = devices.pop() if devices else torch.device("cpu")
    buffer = torch.empty(total, dtype=torch.uint8, device=device)
    views: dict[str, Any] = {}
    for key, t in outputs.items():
        nbytes = t.numel() * t.element_size()
        view = buffer[places[key] : places[key] + nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        views[key] = view
    return buffer, views


def describe_packed(views: Mapping[str, Any], shared: tuple | None) -> dict[str, dict[str, Any]]:
    """The `cuda_ipc` entries of `views`, places in one buffer whose storage `shared` is (what its
    `_share_cuda_` returned; None when the buffer is empty). Every entry names the same storage."""
    entries: dict[str, dict[str, Any]] = {}
    for key, t in views.items():
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPE_NAMES:
            raise ValueError(f"dtype {name} does not travel by cuda_ipc")
        entry: dict[str, Any] = {
            "dtype": name,
            "shape": [int(d) for d in t.shape],
            "stride": [int(s) for s in t.stride()],
            "offset": int(t.storage_offset()),
            "device": int(t.device.index or 0),
            "handle": "",
            "storage_bytes": 0,
            "storage_offset_bytes": 0,
            "ref_counter": "",
            "ref_counter_offset": 0,
        }
        if t.numel() and shared is not None:  # an empty output maps nothing: the parent makes one
            device, handle, size, offset, ref_counter, ref_counter_offset, _event, _sync = shared
            entry.update(
                device=int(device),
                handle=bytes(handle).hex(),
                storage_bytes=int(size),
                storage_offset_bytes=int(offset),
                ref_counter=bytes(ref_counter).hex(),
                ref_counter_offset=int(ref_counter_offset),
            )
        entries[key] = entry
    return entries


def export_cuda_ipc(outputs: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(entries, views) of a `cuda_ipc` chunk (child side): the outputs packed into one buffer on
    their GPU (`pack_outputs`), complete before this returns (the parent waits on no event), and
    shared once. The child keeps `views` (and with them the buffer) alive until the parent has read
    the chunk, and sends them by the host where the parent could not map it."""
    import torch

    for t in outputs.values():  # (a dtype that does not travel is refused by `describe_packed`)
        if t.device.type != "cuda":
            raise ValueError(f"a tensor on {t.device} cannot be exported by cuda_ipc")
    buffer, views = pack_outputs(outputs)
    if buffer.device.type == "cuda":
        torch.cuda.synchronize(buffer.device)
    shared = buffer.untyped_storage()._share_cuda_() if buffer.numel() else None
    return describe_packed(views, shared), views


@dataclass(frozen=True)
class IpcEntry:
    """One validated entry of a `cuda_ipc` chunk."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    device: int
    handle: bytes
    storage_bytes: int
    storage_offset_bytes: int
    ref_counter: bytes
    ref_counter_offset: int


def _int(key: str, field: str, value: Any, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int:
        raise ValueError(f"entry {key}: {field} is a {type(value).__name__}, not an int")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"entry {key}: {field} {value} is outside {bound}")
    return value


def _ints(key: str, field: str, value: Any) -> tuple[int, ...]:
    if type(value) not in (list, tuple) or len(value) > MAX_DIMS:
        raise ValueError(f"entry {key}: {field} must be a list of at most {MAX_DIMS} ints")
    return tuple(_int(key, f"{field}[{i}]", v) for i, v in enumerate(value))


def _hex(key: str, field: str, value: Any, most: int) -> bytes:
    """The bytes a hex field of an entry names: lowercase hex digits only, at most `most` bytes."""
    if type(value) is not str or len(value) > 2 * most or _HEX.fullmatch(value) is None:
        raise ValueError(f"entry {key}: {field} must be lowercase hex of at most {most} bytes")
    return bytes.fromhex(value)


def validate_entry(key: Any, entry: Any, device_index: int, budget: int, child_pid: int) -> IpcEntry:
    """`entry` checked field by field (parent side); ValueError naming the first bad field."""
    if type(key) is not str:
        raise ValueError(f"entry key {key!r} is not a string")
    if type(entry) is not dict:
        raise ValueError(f"entry {key}: a {type(entry).__name__}, not a dict")
    if set(entry) != ENTRY_KEYS:
        odd = sorted(map(str, set(entry) ^ ENTRY_KEYS))
        raise ValueError(f"entry {key}: fields {odd} missing or unexpected")
    dtype = entry["dtype"]
    if type(dtype) is not str or dtype not in DTYPE_NAMES:
        raise ValueError(f"entry {key}: dtype {dtype!r} is not one of {sorted(DTYPE_NAMES)}")
    shape = _ints(key, "shape", entry["shape"])
    stride = _ints(key, "stride", entry["stride"])
    if len(stride) != len(shape):
        raise ValueError(f"entry {key}: {len(stride)} strides for {len(shape)} dims")
    device = _int(key, "device", entry["device"])
    if device != device_index:
        raise ValueError(f"entry {key}: device {device}, but outputs are judged on cuda:{device_index}")
    itemsize = _ITEM_SIZE[dtype]
    numel = 1
    for d in shape:
        numel *= d
    if numel * itemsize > budget:
        raise ValueError(f"entry {key}: {numel * itemsize} bytes, past the output budget of {budget}")
    offset = _int(key, "offset", entry["offset"], high=budget)
    storage_bytes = _int(key, "storage_bytes", entry["storage_bytes"], high=budget)
    storage_offset_bytes = _int(key, "storage_offset_bytes", entry["storage_offset_bytes"], high=2**48)
    ref_counter_offset = _int(key, "ref_counter_offset", entry["ref_counter_offset"], high=REF_COUNTER_SLOTS - 1)
    handle = _hex(key, "handle", entry["handle"], IPC_HANDLE_BYTES)
    ref_counter = _hex(key, "ref_counter", entry["ref_counter"], MAX_REF_COUNTER_BYTES)
    if numel == 0:
        if storage_bytes or handle:
            raise ValueError(f"entry {key}: an empty output names memory to map")
    else:
        last = offset + sum((d - 1) * s for d, s in zip(shape, stride))
        if (last + 1) * itemsize > storage_bytes:
            raise ValueError(f"entry {key}: the view reaches past its storage of {storage_bytes} bytes")
        if storage_offset_bytes % itemsize:
            raise ValueError(f"entry {key}: storage_offset_bytes {storage_offset_bytes} is not {itemsize}-aligned")
        if len(handle) != IPC_HANDLE_BYTES or handle[1] != IPC_HANDLE_TYPE:
            raise ValueError(f"entry {key}: handle is not the {IPC_HANDLE_BYTES}-byte handle of a cudaMalloc block")
        match = _REF_COUNTER.fullmatch(ref_counter)
        if match is None or int(match.group(1)) != child_pid:
            raise ValueError(f"entry {key}: ref_counter {ref_counter[:64]!r} is not a counter file of the child")
    return IpcEntry(
        dtype,
        shape,
        stride,
        offset,
        device,
        handle,
        storage_bytes,
        storage_offset_bytes,
        ref_counter,
        ref_counter_offset,
    )


def validate_chunk(outputs: Any, device_index: int, budget: int, child_pid: int | None) -> dict[str, IpcEntry]:
    """Every entry of a `cuda_ipc` chunk's outputs validated, and their storages within `budget`."""
    if child_pid is None:
        raise ValueError("no child process to map outputs from")
    if type(outputs) is not dict or len(outputs) > MAX_ENTRIES:
        raise ValueError(f"outputs must be a dict of at most {MAX_ENTRIES} entries")
    entries = {key: validate_entry(key, entry, device_index, budget, child_pid) for key, entry in outputs.items()}
    total = sum(size for *_, size in storages(entries.values()))
    if total > budget:
        raise ValueError(f"the chunk maps {total} bytes, past the output budget of {budget}")
    return entries


StorageKey = tuple[int, bytes, int, bytes, int, int]  # device, handle, offset, counter, its slot, bytes


def storage_key(entry: IpcEntry) -> StorageKey:
    """What names the memory an entry's view lies in: entries with the same key share one mapping."""
    return (
        entry.device,
        entry.handle,
        entry.storage_offset_bytes,
        entry.ref_counter,
        entry.ref_counter_offset,
        entry.storage_bytes,
    )


def storages(entries: Any) -> list[StorageKey]:
    """The distinct storages that non-empty `entries` name, in order."""
    return list(dict.fromkeys(storage_key(e) for e in entries if e.storage_bytes))


def receive_cuda_ipc(
    outputs: Any, device_index: int, budget: int, child_pid: int | None, mapped: list[Any] | None = None
) -> dict[str, Any]:
    """The outputs of a `cuda_ipc` chunk as tensors in this process's own GPU memory (parent side),
    on the current stream of `device_index`: each storage the entries name mapped and copied once,
    each output a view of that copy. Every mapping of the child's memory is released before this
    returns, after the copies from it are complete; or, given `mapped`, the copies are only queued
    and the mappings go into it, for the caller to release once that stream's work is complete
    (what it queues behind the copies then costs no second wait for the device)."""
    import torch

    entries = validate_chunk(outputs, device_index, budget, child_pid)
    device = torch.device("cuda", device_index)
    stream = torch.cuda.current_stream(device_index)
    held: list[Any] = [] if mapped is None else mapped  # the child's memory, mapped: kept until copied
    copies: dict[StorageKey, Any] = {}
    try:
        for key in storages(entries.values()):
            copies[key] = _copy_of_storage(key, device, held)
    finally:
        if mapped is None:
            stream.synchronize()
            held.clear()
    received: dict[str, Any] = {}
    for name, entry in entries.items():
        dtype = getattr(torch, entry.dtype)
        if entry.storage_bytes == 0:
            received[name] = torch.empty(entry.shape, dtype=dtype, device=device)
            continue
        view = torch.empty(0, dtype=dtype, device=device)
        view.set_(copies[storage_key(entry)], entry.offset, entry.shape, entry.stride)
        received[name] = view.contiguous()  # the view the child named, whatever strides it gave
    return received


def _copy_of_storage(key: StorageKey, device: Any, mapped: list[Any]) -> Any:
    """The child's storage named by `key`, mapped (kept in `mapped` until the copy completes) and
    copied into a storage of this process's own."""
    import torch

    device_index, handle, storage_offset_bytes, ref_counter, ref_counter_offset, storage_bytes = key
    storage = torch.UntypedStorage._new_shared_cuda(
        device_index,
        handle,
        storage_bytes,
        storage_offset_bytes,
        ref_counter,
        ref_counter_offset,
        _NO_EVENT,
        False,
    )
    mapped.append(storage)
    size = mapped_bytes(storage.data_ptr() - storage_offset_bytes)
    if storage_offset_bytes + storage_bytes > size:
        raise ValueError(
            f"the storage ({storage_bytes} bytes at {storage_offset_bytes}) reaches past "
            f"the {size} bytes its handle maps"
        )
    raw = torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage_bytes,), (1,))
    mapped.append(raw)
    return raw.clone().untyped_storage()


_LIBCUDA: list[Any] = []


def mapped_bytes(base: int) -> int:
    """Size of the device allocation (here: the mapping of a CUDA IPC handle) that starts at `base`,
    as the driver records it (cuMemGetAddressRange); RuntimeError where the driver knows no
    allocation there, ValueError where one starts elsewhere."""
    if not _LIBCUDA:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemGetAddressRange_v2.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]
        lib.cuMemGetAddressRange_v2.restype = ctypes.c_int
        _LIBCUDA.append(lib)
    start, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    status = _LIBCUDA[0].cuMemGetAddressRange_v2(ctypes.byref(start), ctypes.byref(size), ctypes.c_uint64(base))
    if status != 0:
        raise RuntimeError(f"cuMemGetAddressRange failed with CUDA error {status}")
    if start.value != base:
        raise ValueError("the handle's mapping does not start where torch placed it")
    return int(size.value)


def host_chunk(outputs: Mapping[str, Any], fallback: str | None = None) -> dict[str, Any]:
    """A `host` chunk of `outputs` (tensors on the host)."""
    return {"transport": HOST, "outputs": dict(outputs), "fallback": fallback}


def ipc_chunk(entries: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """A `cuda_ipc` chunk of exported entries."""
    return {"transport": CUDA_IPC, "outputs": dict(entries)}
