"""Turn core errors into Temporal errors whose type tells the retry policy what to do."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from gpuyantra.server_client import ServerError


def as_application_error(exc: ServerError) -> ApplicationError:
    # A wrong token, a bad request or a missing server won't fix themselves on retry.
    retryable = exc.kind in ("ServerFailure", "Conflict")
    return ApplicationError(str(exc), type=exc.kind, non_retryable=not retryable)
