"""GPU task queue: profile and benchmark the live server, verify candidates, deploy kernels."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.errors import as_application_error
from activities.heartbeat import with_heartbeat
from gpuyantra import config
from gpuyantra.campaign.records import (
    BenchmarkInput,
    CompareInput,
    DeployInput,
    RollbackAnswer,
    RollbackInput,
    ServerCall,
    ServerProfile,
    SwapAnswer,
    Target,
    VerdictSummary,
    VerifyFileInput,
    VerifyInput,
)
from gpuyantra.campaign.results import FileVerdict
from gpuyantra.files import write_whole
from gpuyantra.hardware import DeviceFacts
from gpuyantra.served_speed import Measurement, PairedAnswer, measurement_of
from gpuyantra.server_client import AdminClient, JsonObject, ServerError
from gpuyantra.trusted_servers import UntrustedServer, resolve


def trusted_client(server_url: str, timeout_s: float = 600.0) -> AdminClient:
    """An admin client for `server_url` with that server's own token, only when this worker trusts it
    (gpuyantra/trusted_servers.py): workflow input alone never decides where the token goes."""
    try:
        server = resolve(server_url)
    except UntrustedServer as exc:
        raise ApplicationError(str(exc), type="UntrustedServer", non_retryable=True) from None
    return AdminClient(server.url, server.token() or "", timeout_s=timeout_s)


def admin_post(server_url: str, path: str, body: JsonObject) -> JsonObject:
    """POST to a trusted server's admin API, heartbeating. The answer is the route's raw JSON: its
    record reads it (ServerProfile.from_answer, SwapAnswer.from_dict, ...)."""
    client = trusted_client(server_url)
    try:
        return with_heartbeat(lambda: client.post(path, body))
    except ServerError as exc:
        raise as_application_error(exc) from exc


@activity.defn(name="profile_server")
def profile_server(call: ServerCall) -> ServerProfile:
    return ServerProfile.from_answer(admin_post(call.server_url, "/admin/profile", {}))


# Five repeats of at least a quarter second each: the campaign judges a swap against their spread.
BENCHMARK = {"max_tokens": 16, "prompt_tokens": 8, "repeats": 5, "min_repeat_s": 0.25}
# How long the check waits for the GPU's locks: longer than one verification's timing phase usually
# holds them, short enough that a stuck one cannot stall the campaign's deployments.
TIMING_LOCK_WAIT_S = 180.0


@activity.defn(name="benchmark_server")
def benchmark_server(call: BenchmarkInput) -> Measurement:
    """Served speed at each of `call.batches` (batch 1 when none), with the GPU timing lock held."""
    batches = sorted(set(call.batches or [1]))
    trusted_client(call.server_url)  # refused before any lock is taken
    try:
        return with_heartbeat(lambda: measure_served_speed(call.server_url, batches))
    except ServerError as exc:
        raise as_application_error(exc) from exc


def measure_served_speed(server_url: str, batches: list[int], wait_s: float = TIMING_LOCK_WAIT_S) -> Measurement:
    """/admin/benchmark at each batch, one after another, while holding the GPU's locks (turnstile,
    timing, quiet; gpuyantra/verifier/gpu_locks.py): queued verifications let this check go first, and
    while it measures no verification times or runs its correctness cases on this GPU."""
    from gpuyantra.verifier.baselines import timing_lock
    from gpuyantra.verifier.gpu_locks import hold_lock

    client = trusted_client(server_url)
    with hold_lock(timing_lock(), wait_s) as lock:
        answers = [client.post("/admin/benchmark", {**BENCHMARK, "batch": batch}) for batch in batches]
    return measurement_of(answers, lock)


# A paired check: three rounds of a swap off and on, two short repeats per phase and batch (about
# 2 x 3 x 2 x 0.2 s per batch, plus one graph capture per side).
COMPARE = {"rounds": 3, "repeats": 2, "min_repeat_s": 0.2, "max_tokens": 16, "prompt_tokens": 8}


@activity.defn(name="compare_swap")
def compare_swap(call: CompareInput) -> PairedAnswer:
    """/admin/compare: served speed with the swap off and on in turns, the GPU's locks held as for
    benchmark_server. A server that predates the route answers 404 without a swap `detail`: then
    `{"measured": "none"}`, and the campaign keeps its first judgement."""
    from gpuyantra.verifier.baselines import timing_lock
    from gpuyantra.verifier.gpu_locks import hold_lock

    body = {**COMPARE, "swap_id": call.swap_id, "batches": sorted(set(call.batches or [1]))}
    client = trusted_client(call.server_url)
    try:
        with hold_lock(timing_lock(), TIMING_LOCK_WAIT_S) as lock:
            answer = with_heartbeat(lambda: client.post("/admin/compare", body))
    except ServerError as exc:
        if "answered 404: Not Found" in str(exc):
            return PairedAnswer(measured="none", reason="the server has no /admin/compare")
        raise as_application_error(exc) from exc
    return PairedAnswer.from_dict({**answer, "timing_lock": lock})


@activity.defn(name="deploy_kernel")
def deploy_kernel(request: DeployInput) -> SwapAnswer:
    target = Target.from_dict(request.target)
    body = {
        "source": request.source,
        "module_class": target.qualified_class,
        "attestation": request.attestation,
    }  # the server swaps only the bytes this attests
    if target.param_shapes:  # linear: only the modules of the target's projection shape
        body["param_shapes"] = target.param_shapes
    if request.rows_gate:  # the row counts where the verdict timed the kernel slower: the original serves them
        body["rows_gate"] = request.rows_gate
    return SwapAnswer.from_dict(admin_post(request.server_url, "/admin/swap", body))


@activity.defn(name="rollback_swap")
def rollback_swap(request: RollbackInput) -> RollbackAnswer:
    answer = admin_post(request.server_url, "/admin/rollback", {"swap_id": request.swap_id})
    return RollbackAnswer(rolled_back=list(answer.get("rolled_back") or []), active=list(answer.get("active") or []))


@activity.defn(name="verify_candidate")
def verify_candidate(request: VerifyInput) -> VerdictSummary:
    """Write the candidate to a real file (kept: it is the audit trail) and run the trust anchor."""
    from gpuyantra.campaign.policy import rows_gate, served_decode_judgement
    from gpuyantra.ops.open import ensure_open_target
    from gpuyantra.triton_env import prepare
    from gpuyantra.verifier import reuse, run_verification

    ensure_open_target(request.target)  # an open op travels with its target

    device = prepare(request.device)
    folder = config.candidates_dir() / request.campaign_id
    folder.mkdir(parents=True, exist_ok=True)
    target = Target.from_dict(request.target)
    # Linear targets share a class: their projection shape (variant) keeps their files apart.
    variant = re.sub(r"[^0-9A-Za-z]+", "_", target.variant or "")
    path = folder / f"{target.op}_{target.module_class}{'_' + variant if variant else ''}_{request.iteration}.py"
    write_whole(path, request.source)
    shapes = [list(s) for s in target.shapes] or None
    # The interpreter checks float32 and float16 (its bfloat16 is unreliable); a GPU checks the live dtype.
    dtypes = [target.dtype] if target.dtype and device != "cpu" else None
    # The served activations' strided/offset layouts the profile saw: the plan draws them exactly.
    layouts = request.target.get("layouts") or None
    # The same bytes asked the same question before (a warm campaign's seeded candidate): reuse.
    key = reuse.verdict_key(
        request.source,
        op=target.op,
        module_class=target.qualified_class,
        shapes=shapes,
        dtypes=dtypes,
        param_shapes=target.param_shapes or None,
        device_name=device_name(device),
        versions=library_versions(),
        layouts=layouts,
    )
    result = reuse.load(key) if reuse.enabled() else None
    if result is None:
        # keep_warm: the next verification on this worker finds its sandbox child started.
        verdict = with_heartbeat(
            lambda: run_verification(
                path,
                device=device,
                module_class=target.qualified_class,
                shapes=shapes,
                dtypes=dtypes,
                keep_warm=device == "cuda",
                param_shapes=target.param_shapes or None,  # linear: the live weight's out-features
                layouts=layouts,
            )
        )
        result = verdict.to_dict()
        result.setdefault("device", device)
        result["timed_on"] = timed_on(device).to_dict()
        reuse.store(key, result)
    result.setdefault("timed_on", timed_on(device).to_dict())  # a verdict reused from before devices were named
    result["candidate_path"] = str(path)
    # The campaign's gates go beside the signed verdict, never over it.
    judged = served_decode_judgement(result, request.target)
    return VerdictSummary.from_dict({**result, "judged_on": judged, "rows_gate": rows_gate(result)})


@activity.defn(name="verify_file")
def verify_file(request: VerifyFileInput) -> FileVerdict:
    """`gpuyantra verify FILE` on this worker (the VerifyKernel workflow): the same verifier with the
    command's options, from a sandbox child this worker keeps started. The candidate is written under
    the state folder's `candidates/verify/` (the audit trail), named by its bytes. A KernelBench
    problem comes as its text, kept in this worker's state folder (gpuyantra/verify_target.py): no
    path a request names is read."""
    import hashlib

    from temporalio.exceptions import ApplicationError

    from gpuyantra.triton_env import prepare
    from gpuyantra.verify_client import TARGET_UNUSABLE
    from gpuyantra.verify_target import NamedTarget, TargetUnusable, verify_named

    device = prepare(request.device)
    folder = config.candidates_dir() / "verify"
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^0-9A-Za-z_]+", "_", request.file_name.rsplit("/", 1)[-1].removesuffix(".py"))[:60] or "candidate"
    path = folder / f"{stem}_{hashlib.sha256(request.source.encode()).hexdigest()[:12]}.py"
    write_whole(path, request.source)
    named = NamedTarget(
        problem_name=request.problem_name, problem_source=request.problem_source, module_class=request.module_class
    )
    try:
        verdict = with_heartbeat(
            lambda: verify_named(
                path,
                named,
                request.source,
                device=device,
                shapes=request.shapes,
                dtypes=request.dtypes,
                timeout=request.timeout,
                keep_warm=device == "cuda",
                param_shapes=request.param_shapes or None,
            )
        )
    except TargetUnusable as exc:
        raise ApplicationError(str(exc), type=TARGET_UNUSABLE, non_retryable=True) from None
    return cast(
        FileVerdict,
        {**verdict.to_dict(), "device": device, "timed_on": timed_on(device).to_dict(), "candidate_path": str(path)},
    )


def timed_on(device: str) -> DeviceFacts:
    """The device a verdict was timed on: the worker's announced facts (kind, device, its name and
    key, host), else what this process knows of `device`. A verdict carries it as `to_dict()`."""
    from gpuyantra.hardware import announced, device_facts

    return announced() or device_facts(device)


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else device


def library_versions() -> dict[str, str]:
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__}


ACTIVITIES: list[Callable[..., Any]] = [
    profile_server,
    benchmark_server,
    verify_candidate,
    verify_file,
    deploy_kernel,
    rollback_swap,
    compare_swap,
]
