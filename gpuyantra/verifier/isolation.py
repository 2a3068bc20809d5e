"""What keeps the sandbox child from the verifier's secrets and from outliving its verdict.

The child runs candidate code (as root on some hosts, where permissions alone stop nothing), so it
takes, before anything else (`apply`, from `child.main`), every layer this kernel offers without
privileges, each optional and each recorded (`isolation` in the results and the verdict):

- `no_new_privs` (prctl): no privileges gained by exec; Landlock and seccomp need it.
- `landlock` (the ABI version, 0 where none): reads only beneath the interpreter, its libraries,
  the import paths (the repository's among them) split around the state folder and the temporary
  folder, whose entries stay unreadable (`readable_beneath`),
  system folders, `/sys`, and of `/proc` its own entries (CPU; all of it on CUDA); opens only
  harmless device files (`/dev/null`, `/dev/urandom`, ...) and on CUDA the GPU's (never a disk: root
  reads a raw block device past every path rule); reads the shared compiler caches but never writes
  them (`compiler_cache`); writes only beneath the sandbox's folder (its own compiler caches
  there) and, on CUDA, `/dev/shm` and the GPU lock files. So the state folder's
  attestation key and admin token cannot be read and nothing can be written there. Its domain also
  denies attaching to processes outside it (their `mem`, their descriptors); from ABI 6 signalling
  them too. Reading another process's `environ` it does not deny: the `/proc` rule does on CPU.
- `capabilities`, all dropped: root without CAP_SYS_PTRACE reads no non-dumpable process's `environ`
  or `mem` (the verifying process and the fork server are non-dumpable: `protect_parent`).
- `seccomp` (x86-64): `setsid` fails, so nothing the candidate starts leaves the child's session,
  which the parent watches and kills (a double fork stays in it); so do ptrace, reading or writing
  other processes' memory, mounts, namespaces, kernel modules, BPF, and opening files by handle
  (which would go around Landlock's paths).

The policy (which folders) is the parent's (`policy`); it travels as one JSON argument.
The parent also makes itself non-dumpable (`protect_parent`): where Landlock is missing, a child of
the same user still cannot read its environment or memory (root bypasses that; Landlock does not).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import gpuyantra

REPO_ROOT = Path(gpuyantra.__file__).resolve().parent.parent
# The repository's folders the child imports from (the state folder may lie beside them).
CHILD_PACKAGES = ("gpuyantra",)
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/sys")
# Of /etc, what the dynamic loader, libc and Python's start read; not the rest (root reads /etc/shadow).
ETC_READ = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/os-release",
    "/etc/alternatives",
)
# Device files the child may open (never a disk: root reads a raw block device past every path rule).
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")  # CUDA: the driver's files
SHARED_MEMORY = "/dev/shm"
KERNEL_MEMORY = ("kcore", "kmsg", "kpagecount", "kpageflags", "kpagecgroup")  # never readable in /proc
# The shared compiler caches, read-only to the child (it writes its own: `compiler_cache`).
SHARED_CACHE_VARIABLES = ("GPUYANTRA_SHARED_TRITON_CACHE_DIR", "GPUYANTRA_SHARED_INDUCTOR_CACHE_DIR")
SWITCH = "GPUYANTRA_SANDBOX_ISOLATION"  # "0": the parent asks for none of these layers (diagnosis)

# --- Landlock (linux/landlock.h) -------------------------------------------------------------------
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
SCOPE_SIGNAL = 1 << 1  # ABI 6
FS_ABI1_ALL = (1 << 13) - 1
READ_RIGHTS = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # all a file may take
O_PATH = getattr(os, "O_PATH", 0o10000000)

# --- seccomp (linux/seccomp.h, linux/filter.h) -------------------------------------------------------
PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_LAST = 63  # dropping a number past the kernel's last capability fails harmlessly
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_SECCOMP = 317  # x86-64
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1  # every thread of the process, not only the caller
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM = 1
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_RET_K = 0x06
# x86-64 numbers of what the child never needs and a candidate could escape or spy with.
DENIED_SYSCALLS = {
    "ptrace": 101,
    "setsid": 112,
    "chroot": 161,
    "pivot_root": 155,
    "mount": 165,
    "umount2": 166,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "kexec_load": 246,
    "unshare": 272,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}


def policy(
    device: str, workdir: Path, env: dict[str, str], lock_files: list[str], secret_folders: list[Path]
) -> dict[str, Any]:
    """The folders a child working in `workdir` with environment `env` may read and write (its JSON
    argument). Import paths (the repository's root among them) are readable except what is, or
    holds, one of `secret_folders` (the state folder) or the temporary folder (`readable_beneath`)."""
    if os.environ.get(SWITCH, "1") == "0":
        return {"off": True}
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    python.add(str(Path(sys.executable).resolve().parent.parent))
    on_path = {p for p in sys.path if p and Path(p).is_dir()} | python
    # Never listed whole, though an import path may lie inside one (a virtual environment, a clone
    # in the temporary folder): the temporary folder (other sandboxes' folders, often a state folder)
    # and the repository's hidden entries (`.state`, version-control metadata, credentials).
    imports = {Path(p).resolve() for p in on_path}
    hidden = [e.resolve() for e in REPO_ROOT.glob(".*") if e.resolve() not in imports]
    closed = [Path(tempfile.gettempdir()).resolve(), *hidden]
    secrets = [Path(f).resolve() for f in secret_folders]
    on_path.add(str(REPO_ROOT))
    readable = {kept for p in on_path for kept in readable_beneath(Path(p).resolve(), secrets, closed)}
    packages = {str(REPO_ROOT / name) for name in CHILD_PACKAGES}
    # Read, never written: only trusted processes write them (`compiler_cache.promote`).
    shared_caches = {env[key] for key in SHARED_CACHE_VARIABLES if env.get(key)}
    return {
        "read": sorted(readable | packages | shared_caches | set(SYSTEM_READ) | set(ETC_READ)),
        # CUDA: torch's IPC reference counters (the outputs' handles) live in /dev/shm.
        "write": sorted({str(workdir), *([SHARED_MEMORY] if device == "cuda" else [])}),
        "devices": device_files(device),
        "files": sorted(lock_files),
        # CUDA: the driver and the compilers it starts read /proc/<their pid>: all of /proc stays
        # readable there, and the parents' non-dumpable state with the child's capabilities gone
        # keeps their environment and memory out of reach.
        "proc": "all" if device == "cuda" else "own",
    }


def readable_beneath(folder: Path, secrets: list[Path], closed: list[Path]) -> list[str]:
    """What of `folder` (an import path) the child may read: none when it lies in one of `secrets`
    or is one of `closed`; all of it when it holds none of `secrets` or `closed`; else its entries, split the same way,
    leaving out the hidden ones and `closed` themselves. So a module class of the user's project (or
    the repository's tests) imports while the state folder beside it stays unreadable."""
    if folder in closed or any(_within(folder, secret) for secret in secrets):
        return []
    if not any(_within(guard, folder) for guard in [*secrets, *closed]):
        return [str(folder)]
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    kept: list[str] = []
    for entry in entries:
        resolved = entry.resolve()
        if not entry.name.startswith(".") and resolved not in closed:
            kept += readable_beneath(resolved, secrets, closed)
    return kept


def device_files(device: str) -> list[str]:
    """The device files (and, on CUDA, the GPU's device folders) the child may open."""
    found = list(DEVICE_FILES)
    if device == "cuda":
        found += sorted({str(path) for pattern in GPU_DEVICES for path in Path("/").glob(pattern.lstrip("/"))})
    return found


def _within(inner: Path, outer: Path) -> bool:
    """Whether `inner` is `outer` or lies beneath it."""
    return inner == outer or outer in inner.parents


def protect_parent() -> bool:
    """Make this process non-dumpable: a process of the same user (root too, once it has dropped its
    capabilities) can no longer read its environment or memory through /proc. True where it held."""
    return _prctl(PR_SET_DUMPABLE, 0)


def undo_protect_parent() -> None:
    """A process forked from a protected one (a fork server's child) dumpable again, as a child
    started as a new interpreter is."""
    _prctl(PR_SET_DUMPABLE, 1)


def apply(chosen: dict[str, Any]) -> dict[str, Any]:
    """Take every layer `chosen` (the parent's `policy`) asks for that this kernel offers; returns
    which held (the verdict's `isolation`): `no_new_privs`, `landlock` (ABI, 0: none),
    `landlock_signals`, `proc` ("own": only this process's /proc entries, "all", None), `capabilities`
    (all dropped), `seccomp`, `threads` (this process's threads when it restricted itself: Landlock
    and capabilities hold for the calling thread and what it starts; seccomp for all)."""
    if chosen.get("off"):
        return {"off": True, "landlock": 0, "seccomp": False}
    held: dict[str, Any] = {"no_new_privs": _prctl(PR_SET_NO_NEW_PRIVS, 1)}
    for path in chosen.get("files", []):  # a lock file must exist for a rule to name it
        with contextlib.suppress(OSError):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o666))
    for path in chosen.get("write", []):
        with contextlib.suppress(OSError):
            Path(path).mkdir(parents=True, exist_ok=True)
    abi, signals = _landlock(chosen) if held["no_new_privs"] else (0, False)
    held["landlock"], held["landlock_signals"] = abi, signals
    held["proc"] = chosen.get("proc") if abi else None
    held["capabilities"] = _drop_capabilities()
    held["seccomp"] = held["no_new_privs"] and _seccomp()
    held["threads"] = _thread_count()
    return held


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(_libc().prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (or not on x86-64/aarch64 Linux)."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        return 0
    try:
        version = int(_libc().syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def _handled_rights(abi: int) -> int:
    rights = FS_ABI1_ALL
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def _landlock(chosen: dict[str, Any]) -> tuple[int, bool]:
    """Restrict this thread (and what it starts) to the policy's folders; (ABI, signals scoped)."""
    abi = landlock_abi()
    if abi < 1:
        return 0, False
    libc = _libc()
    handled = _handled_rights(abi)
    scoped = SCOPE_SIGNAL if abi >= 6 else 0
    # struct landlock_ruleset_attr grew with the ABI: fs rights (1), net rights (4), scopes (6).
    attr = struct.pack("=QQQ", handled, 0, scoped) if abi >= 6 else struct.pack("=Q", handled)
    buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = int(libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buffer, ctypes.c_size_t(len(attr)), 0))
    if ruleset < 0:
        return 0, False
    try:
        every = handled
        device_rights = (READ_RIGHTS | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV) & handled
        rules = [(p, READ_RIGHTS) for p in [*chosen.get("read", []), *_proc_entries(chosen.get("proc"))]]
        rules += [(p, device_rights) for p in chosen.get("devices", [])]
        rules.append(("/dev", FS_READ_DIR))  # listing it; opening nothing but the files above
        rules += [(p, every) for p in chosen.get("write", [])]
        if chosen.get("proc") == "all":  # CUDA: the driver's initialisation writes its own /proc entries
            rules.append((f"/proc/{os.getpid()}", every))
        rules += [(p, FILE_RIGHTS & handled) for p in chosen.get("files", [])]
        for path, rights in rules:
            _add_rule(libc, ruleset, path, rights)
        if int(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0)) != 0:
            return 0, False
    finally:
        os.close(ruleset)
    return abi, bool(scoped)


# This process's own /proc folder, held open so the entry a rule names stays the one path lookups find.
_OWN_PROC: list[int] = []


def _proc_entries(mode: str | None) -> list[str]:
    """What of /proc is readable: all of it, or (`own`) everything but other processes' folders."""
    if mode == "all":
        return ["/proc"]
    if mode != "own":
        return []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    own = f"/proc/{os.getpid()}"
    with contextlib.suppress(OSError):
        _OWN_PROC.append(os.open(own, O_PATH | os.O_CLOEXEC))
    skipped = {"self", "thread-self", *KERNEL_MEMORY}
    return [f"/proc/{name}" for name in names if not name.isdigit() and name not in skipped] + [own]


def _add_rule(libc: Any, ruleset: int, path: str, rights: int) -> None:
    """Allow `rights` beneath `path` (a folder) or on it (a file: file rights only); skipped where it
    does not exist."""
    try:
        fd = os.open(path, O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not Path(path).is_dir():
            rights &= FILE_RIGHTS
        rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
        buffer = ctypes.create_string_buffer(rule, len(rule))
        libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, buffer, 0)
    finally:
        os.close(fd)


def _drop_capabilities() -> bool:
    """Give up every capability (effective, permitted, inheritable, ambient, bounding): root without
    CAP_SYS_PTRACE reads no non-dumpable process's /proc files, and without CAP_SYS_ADMIN and the rest
    mounts, loads and reconfigures nothing. True where the effective set is empty afterwards."""
    if not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    with contextlib.suppress(OSError, AttributeError):
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        for capability in range(CAP_LAST + 1):
            libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
        header = ctypes.create_string_buffer(struct.pack("=Ii", LINUX_CAPABILITY_VERSION_3, 0), 8)
        data = ctypes.create_string_buffer(bytes(24), 24)  # two {effective, permitted, inheritable}
        libc.capset(header, data)  # glibc's wrapper: the syscall's number differs by architecture
    try:
        with open("/proc/self/status") as status:
            line = next(row for row in status if row.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return int(line.split()[1], 16) == 0


def _seccomp_program() -> bytes:
    """A classic BPF filter: another architecture or the x32 ABI, or a denied syscall, fails with
    EPERM; everything else is allowed."""

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    denied = sorted(DENIED_SYSCALLS.values())
    refuse = len(denied) + 6  # the index of the EPERM return, after the checks and the allow
    program = [op(BPF_LD_W_ABS, 4), op(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0), op(BPF_RET_K, SECCOMP_RET_ERRNO | EPERM)]
    program.append(op(BPF_LD_W_ABS, 0))  # the syscall number
    program.append(op(BPF_JGE_K, X32_SYSCALL_BIT, refuse - len(program) - 1, 0))
    for number in denied:
        program.append(op(BPF_JEQ_K, number, refuse - len(program) - 1, 0))
    program.append(op(BPF_RET_K, SECCOMP_RET_ALLOW))
    program.append(op(BPF_RET_K, SECCOMP_RET_ERRNO | EPERM))
    assert len(program) == refuse + 1
    return b"".join(program)


def _seccomp() -> bool:
    """Install the filter on every thread of this process (x86-64 Linux only)."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return False
    program = _seccomp_program()
    count = len(program) // 8
    filters = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("=HxxxxxxQ", count, ctypes.addressof(filters))  # struct sock_fprog
    fprog_buffer = ctypes.create_string_buffer(fprog, len(fprog))
    try:
        flags = SECCOMP_FILTER_FLAG_TSYNC
        return int(_libc().syscall(SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, flags, fprog_buffer)) == 0
    except (OSError, AttributeError):
        return False


def to_argument(chosen: dict[str, Any]) -> str:
    return json.dumps(chosen, separators=(",", ":"))
