"""GPU task queue: profile and benchmark the live server, verify candidates, deploy kernels."""

from __future__ import annotations

from typing import Any

from temporalio import activity

from activities.errors import as_application_error
from gpuyantra import config
from gpuyantra.server_client import AdminClient, ServerError
from workflows.types import DeployInput, RollbackInput, ServerCall, VerifyInput


def _admin(server_url: str) -> AdminClient:
    return AdminClient(server_url)


@activity.defn(name="profile_server")
def profile_server(call: ServerCall) -> dict[str, Any]:
    try:
        return _admin(call.server_url).post("/admin/profile", {})
    except ServerError as exc:
        raise as_application_error(exc) from exc


@activity.defn(name="benchmark_server")
def benchmark_server(call: ServerCall) -> dict[str, Any]:
    try:
        return _admin(call.server_url).post("/admin/benchmark", {"max_tokens": 16, "prompt_tokens": 8})
    except ServerError as exc:
        raise as_application_error(exc) from exc


@activity.defn(name="verify_candidate")
def verify_candidate(request: VerifyInput) -> dict[str, Any]:
    """Write the candidate to a real file (kept: it is the audit trail) and run the trust anchor."""
    from gpuyantra.triton_env import prepare
    from gpuyantra.verifier import verify

    device = prepare(request.device)
    folder = config.candidates_dir() / request.campaign_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{request.target['op']}_{request.target['module_class']}_{request.iteration}.py"
    path.write_text(request.source)
    target = request.target
    shapes = [list(s) for s in target.get("shapes", [])] or None
    dtypes = [target["dtype"]] if target.get("dtype") else None
    if device == "cpu":
        dtypes = None  # the interpreter checks float32 and float16 (its bfloat16 is unreliable)
    verdict = verify(path, device=device, module_class=target.get("qualified_class"), shapes=shapes, dtypes=dtypes)
    result = verdict.to_dict()
    result.setdefault("device", device)
    result["candidate_path"] = str(path)
    return result


@activity.defn(name="deploy_kernel")
def deploy_kernel(request: DeployInput) -> dict[str, Any]:
    body = {"source": request.source, "module_class": request.target.get("qualified_class")}
    try:
        return _admin(request.server_url).post("/admin/swap", body)
    except ServerError as exc:
        raise as_application_error(exc) from exc


@activity.defn(name="rollback_swap")
def rollback_swap(request: RollbackInput) -> dict[str, Any]:
    try:
        return _admin(request.server_url).post("/admin/rollback", {"swap_id": request.swap_id})
    except ServerError as exc:
        raise as_application_error(exc) from exc


ACTIVITIES = [profile_server, benchmark_server, verify_candidate, deploy_kernel, rollback_swap]
