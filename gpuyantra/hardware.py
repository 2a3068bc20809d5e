"""Facts about the device a model runs on: its hardware class and a measured roofline.

`hardware_class(device)` names the hardware the way the skill library files it ("cpu",
"nvidia-h200", "nvidia-a100", "nvidia-l4", ...): lower-case, memory size and form factor dropped,
so every H200 shares one class.

`get_hardware(device)` returns a `HardwareSpec`: copy bandwidth and matmul rate (the two roofs),
the host cost of one eager PyTorch launch, and the host cost of one Triton kernel call from Python
(what a swapped-in kernel pays per call). On CUDA these are measured once per hardware class and
torch/triton version and cached as JSON in `state_dir()/hardware/<class>.json` (a few seconds the
first time). On CPU nothing is measured: conservative constants are returned with
`measured: false` (kernels run in Triton's interpreter there and speed is never judged).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

# Conservative CPU roofs: one DRAM channel's copy rate, a few cores' fp32 FMA rate.
CPU_COPY_BYTES_PER_S = 10e9
CPU_MATMUL_FLOPS_PER_S = 50e9
CPU_LAUNCH_US = 5.0  # dispatch cost of one small eager aten op on the host
# Smallest useful device-side duration of any kernel (launch latency on the device, tail effects).
GPU_MIN_KERNEL_US = 2.0

_DROP_TOKENS = re.compile(r"^(\d+gb|pcie|sxm\d*|hbm\d*e?|nvl|mig.*|\d+c|\d+g|geforce|tesla)$")


@dataclass
class HardwareSpec:
    name: str  # hardware class: "cpu", "nvidia-h200", ...
    device: str  # "cpu" | "cuda" | "cuda:1"
    device_name: str  # what the driver calls it: "NVIDIA H200"
    copy_bytes_per_s: float  # device-to-device copy, bytes read + written per second
    matmul_flops_per_s: float  # dense bf16 (fp16 / fp32 where unsupported) matmul rate
    launch_us: float  # host time to issue one small eager aten op
    triton_launch_us: float | None = None  # host time of one Triton kernel call through its entry
    min_kernel_us: float = GPU_MIN_KERNEL_US  # least device time any kernel takes
    measured: bool = False
    measured_at: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP per byte) where the matmul roof meets the bandwidth roof."""
        return self.matmul_flops_per_s / self.copy_bytes_per_s

    @property
    def replacement_launch_us(self) -> float:
        """Host cost per call of a swapped-in Triton kernel (measured when known)."""
        if self.triton_launch_us is not None:
            return self.triton_launch_us
        return 3.0 * self.launch_us

    def floor_us(self, bytes_moved: float, flops: float) -> float:
        """Roofline lower bound of one call, in microseconds."""
        return 1e6 * max(bytes_moved / self.copy_bytes_per_s, flops / self.matmul_flops_per_s)

    def regime(self, arithmetic_intensity: float) -> str:
        return "memory-bound" if arithmetic_intensity < self.ridge else "compute-bound"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ridge"] = self.ridge
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareSpec:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def _normalize_device(device: Any) -> str:
    text = str(device) if device is not None else "cpu"
    return text or "cpu"


def class_from_name(device_name: str, vendor: str = "nvidia") -> str:
    """'NVIDIA H200' -> 'nvidia-h200'; 'NVIDIA A100-SXM4-80GB' -> 'nvidia-a100'."""
    tokens = [t for t in re.split(r"[^a-z0-9]+", device_name.lower()) if t]
    tokens = [t for t in tokens if t not in ("nvidia", "amd", vendor) and not _DROP_TOKENS.match(t)]
    return "-".join([vendor, *tokens]) if tokens else vendor


def hardware_class(device: Any = "cpu") -> str:
    """The hardware class skills are filed under, for a torch device string or object."""
    device = _normalize_device(device)
    if not device.startswith("cuda"):
        return device.split(":")[0]
    import torch

    index = torch.device(device).index
    name = torch.cuda.get_device_name(index if index is not None else torch.cuda.current_device())
    vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
    return class_from_name(name, vendor)


def cache_path(name: str) -> Path:
    from gpuyantra.config import state_dir

    return state_dir() / "hardware" / f"{name}.json"


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = str(torch.version.cuda)
    except Exception:  # noqa: BLE001
        pass
    try:
        from importlib.metadata import version

        out["triton"] = version("triton")
    except Exception:  # noqa: BLE001
        pass
    return out


def cpu_spec(device: str = "cpu") -> HardwareSpec:
    import platform

    return HardwareSpec(
        name="cpu",
        device=device,
        device_name=platform.processor() or platform.machine() or "cpu",
        copy_bytes_per_s=CPU_COPY_BYTES_PER_S,
        matmul_flops_per_s=CPU_MATMUL_FLOPS_PER_S,
        launch_us=CPU_LAUNCH_US,
        triton_launch_us=None,
        min_kernel_us=0.0,
        measured=False,
        versions=_versions(),
    )


_MEMO: dict[str, HardwareSpec] = {}


def get_hardware(device: Any = "cpu", refresh: bool = False, use_cache: bool = True) -> HardwareSpec:
    """The spec of `device`: constants on CPU, measured-once-and-cached numbers on CUDA."""
    device = _normalize_device(device)
    if not device.startswith("cuda"):
        return cpu_spec(device)
    name = hardware_class(device)
    versions = _versions()
    if not refresh and device in _MEMO:
        return _MEMO[device]
    path = cache_path(name)
    if use_cache and not refresh and path.exists():
        try:
            spec = HardwareSpec.from_dict(json.loads(path.read_text()))
            if spec.measured and spec.versions == versions:
                spec.device = device
                _MEMO[device] = spec
                return spec
        except (OSError, ValueError, TypeError):
            pass  # unreadable or stale cache: measure again
    spec = measure_cuda(device)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass
    _MEMO[device] = spec
    return spec


def _time_cuda(fn, iters: int, warmup: int = 2) -> float:
    """Mean seconds of one `fn()` by CUDA events, after warm-up."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _host_us(fn, iters: int, warmup: int = 20) -> float:
    """Median host microseconds to issue `fn()` (no synchronization inside the timed loop)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
        torch.cuda.synchronize()
    samples.sort()
    return samples[len(samples) // 2]


def measure_cuda(device: str = "cuda") -> HardwareSpec:
    """Measure copy bandwidth, matmul rate, eager launch cost and Triton call cost (~2-5 s)."""
    import torch

    dev = torch.device(device)
    with torch.cuda.device(dev):
        name = torch.cuda.get_device_name(dev)
        props = torch.cuda.get_device_properties(dev)
        free, _total = torch.cuda.mem_get_info(dev)
        # Copy: 256 MiB each way (smaller when memory is short), well beyond any L2.
        copy_bytes = int(min(256 * 2**20, max(free // 8, 2**20)))
        src = torch.empty(copy_bytes, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        seconds = _time_cuda(partial(dst.copy_, src), iters=20)
        copy_rate = 2 * copy_bytes / seconds
        del src, dst
        # Matmul: bf16 where supported, a square size that fills the machine.
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        n = 8192 if free > 6 * 8192 * 8192 * 2 else 2048
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        seconds = _time_cuda(partial(torch.mm, a, b), iters=10, warmup=3)
        matmul_rate = 2 * n**3 / seconds
        del a, b
        # Host cost of a small eager op, the unit of launch-bound time.
        tiny = torch.zeros(16, device=dev)
        launch_us = _host_us(lambda: tiny.add_(1.0), iters=200)
        triton_us = _triton_call_us(dev)
        torch.cuda.synchronize()
    return HardwareSpec(
        name=class_from_name(name, "amd" if getattr(torch.version, "hip", None) else "nvidia"),
        device=device,
        device_name=name,
        copy_bytes_per_s=copy_rate,
        matmul_flops_per_s=matmul_rate,
        launch_us=launch_us,
        triton_launch_us=triton_us,
        min_kernel_us=GPU_MIN_KERNEL_US,
        measured=True,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        versions=_versions(),
        extra={
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "matmul_dtype": str(dtype).replace("torch.", ""),
            "matmul_n": n,
            "copy_bytes": copy_bytes,
        },
    )


def _triton_call_us(dev) -> float | None:
    """Host microseconds of one call of the template rms_norm kernel's entry on a decode-sized row."""
    try:
        import torch

        from gpuyantra.kernels import rms_norm as template

        x = torch.randn(1, 1536, device=dev, dtype=torch.bfloat16)
        w = torch.ones(1536, device=dev, dtype=torch.bfloat16)
        return _host_us(lambda: template.entry(x, weight=w, eps=1e-6), iters=100, warmup=5)
    except Exception:  # noqa: BLE001 - no Triton for this device: fall back to a multiple of launch_us
        return None


# --- Hardware kinds: what a GPU worker announces and which verification queue it polls -------------

# Tokens of a device name that do not change what a kernel's timing means: the usual form factor
# (SXM), the memory technology and the vendor's marketing words. Memory size, PCIe and NVL stay: an
# H100 PCIe or NVL copies at a different rate than an SXM one, and a MIG slice is a smaller GPU.
_KIND_DROP_TOKENS = re.compile(r"^(sxm\d*|hbm\d*e?|geforce|tesla)$")
KIND_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def hardware_kind(device_name: str, vendor: str = "nvidia") -> str:
    """The kind verdicts are comparable within, from what the driver calls the device:
    'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb', 'NVIDIA A100-SXM4-40GB' -> 'nvidia-a100-40gb',
    'NVIDIA H200' -> 'nvidia-h200'; 'cpu' (or a CPU's processor name) -> 'cpu'. A name that is already
    a kind is returned as it is."""
    text = (device_name or "").strip().lower()
    if not text or text == "cpu":
        return "cpu"
    if KIND_PATTERN.match(text) and not text.startswith(("nvidia ", "amd ")) and " " not in text:
        return text
    tokens = [t for t in re.split(r"[^a-z0-9]+", text) if t]
    tokens = [t for t in tokens if t not in ("nvidia", "amd", vendor) and not _KIND_DROP_TOKENS.match(t)]
    return "-".join([vendor, *tokens]) if tokens else vendor


def check_kind(kind: str) -> str:
    """`kind` when it can name a task queue (lower-case letters, digits, '.', '_', '-'); else a
    ValueError naming the rule."""
    if not KIND_PATTERN.match(kind):
        raise ValueError(f"hardware kind {kind!r} must be 1-63 lower-case letters, digits, '.', '_' or '-'")
    return kind


@dataclass(frozen=True)
class DeviceFacts:
    """What one GPU worker holds, as it announces it and as its verdicts name it."""

    kind: str  # "nvidia-h100-80gb", "cpu", or the --hardware-kind given
    device: str  # "cuda:1" as the machine numbers it, "cpu"
    device_name: str  # "NVIDIA H100 80GB HBM3"
    device_key: str  # this device among all machines: the GPU's UUID, else host:device
    host: str
    memory_bytes: int | None = None
    capability: str | None = None  # CUDA compute capability, "9.0"
    copy_gb_per_s: float | None = None  # measured copy bandwidth, once a worker has measured it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for the worker's start message."""
        memory = f", {self.memory_bytes / 2**30:.1f} GiB" if self.memory_bytes else ""
        capability = f", capability {self.capability}" if self.capability else ""
        bandwidth = f", copy {self.copy_gb_per_s:.0f} GB/s" if self.copy_gb_per_s else ""
        return f"{self.device} {self.device_name} (kind {self.kind}{memory}{capability}{bandwidth})"


_ANNOUNCED: list[DeviceFacts] = []  # this process's GPU worker's device, once it announced it


def announce(facts: DeviceFacts) -> None:
    """This process is the GPU worker of `facts`'s device: its verdicts name it (`announced`)."""
    _ANNOUNCED[:] = [facts]


def announced() -> DeviceFacts | None:
    """The device this process's GPU worker announced; None outside a worker."""
    return _ANNOUNCED[0] if _ANNOUNCED else None


def device_facts(device: str, kind_override: str | None = None, machine_device: str | None = None) -> DeviceFacts:
    """The facts of `device` ("cpu", "cuda", "cuda:1") in this process; `kind_override` replaces the
    kind derived from the device name (tests, and GPUs whose names say too little); `machine_device`
    is how the machine numbers it when this process sees it alone (`CUDA_VISIBLE_DEVICES`)."""
    import socket

    host = socket.gethostname()
    if not device.startswith("cuda"):
        name = "cpu"
        return DeviceFacts(check_kind(kind_override or "cpu"), device, name, f"{host}:{device}", host)
    import torch

    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
    return DeviceFacts(
        kind=check_kind(kind_override or hardware_kind(props.name, vendor)),
        device=machine_device or f"cuda:{index}",
        device_name=props.name,
        device_key=gpu_uuid(device) or f"{host}:{machine_device or f'cuda:{index}'}",
        host=host,
        memory_bytes=int(props.total_memory),
        capability=f"{props.major}.{props.minor}",
        copy_gb_per_s=_kept_copy_bandwidth(props.name),
    )


def gpu_uuid(device: Any) -> str | None:
    """'GPU-5c1f...': the CUDA device's UUID, the same in every process that sees it, whatever index
    `CUDA_VISIBLE_DEVICES` gives it there (how a campaign tells the serving GPU from the others);
    None on CPU or when torch does not say."""
    text = _normalize_device(device)
    if not text.startswith("cuda"):
        return None
    try:
        import torch

        index = torch.device(text).index
        uuid = getattr(torch.cuda.get_device_properties(index if index is not None else 0), "uuid", None)
    except Exception:  # noqa: BLE001
        return None
    return f"GPU-{uuid}" if uuid is not None else None


def _kept_copy_bandwidth(device_name: str) -> float | None:
    """The copy bandwidth a worker measured on this device name before (the verifier's cache)."""
    try:
        from gpuyantra.verifier.baselines import bandwidth_cache

        value = bandwidth_cache().get(device_name)
        return float(value) if value else None
    except Exception:  # noqa: BLE001 - a fact for the announcement only
        return None


def visible_cuda_devices() -> list[str]:
    """`cuda:0`, `cuda:1`, ... for every device this process sees; [] without CUDA."""
    try:
        import torch

        return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    except Exception:  # noqa: BLE001
        return []
