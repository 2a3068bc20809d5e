"""`gpuyantra verify FILE` through this machine's GPU worker: one `verify_file` activity on the GPU
queue. The worker's sandbox children are started and warm (torch, triton, the CUDA context, the
compiler's modules) and its compiled baselines kept: a warm verdict took 1.6-3.7 s through it on an
H200, against 12-17 s from a new process paying its imports first. Visible in the Web UI as
`VerifyKernel`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities import gpu  # torch only inside the activities' bodies
    from gpuyantra.campaign.inputs import InvalidInput, parse_verify_input
    from gpuyantra.campaign.results import FileVerdict  # stdlib only
    from gpuyantra.config import GPU_TASK_QUEUE  # stdlib only

# The sandbox's own limit on CUDA when the request names none (gpuyantra/verifier/sandbox.py).
DEFAULT_SANDBOX_TIMEOUT_S = 600.0
# Beyond the sandbox's limit: the parent's setup and judging.
VERIFY_MARGIN_S = 120.0
# A verdict is not repeated when its worker is lost: the command says so and the user runs it again.
ONCE = RetryPolicy(maximum_attempts=1)


@workflow.defn(name="VerifyKernel")
class VerifyKernel:
    @workflow.run
    async def run(self, *args: Any) -> FileVerdict:
        # Raw JSON in, checked here (as the campaign's): a bad input fails the run with the field named.
        try:
            request = parse_verify_input(args)
        except InvalidInput as exc:
            raise ApplicationError(str(exc), type="InvalidInput", non_retryable=True) from None
        limit = (request.timeout or DEFAULT_SANDBOX_TIMEOUT_S) + VERIFY_MARGIN_S
        return await workflow.execute_activity(
            gpu.verify_file,
            request,
            task_queue=GPU_TASK_QUEUE,
            start_to_close_timeout=timedelta(seconds=limit),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=ONCE,
            summary=f"verify {request.file_name}",
        )
