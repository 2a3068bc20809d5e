"""Shared fixtures. Kernels run in Triton's interpreter on this CPU-only machine; the variable
must be set before anything imports triton."""

from __future__ import annotations

import os
import secrets
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One attestation key for the whole run: the verifier, in-process apps, helpers that sign, and every
# server and worker process the tests start (they inherit the environment) agree on it.
os.environ.setdefault("GPUYANTRA_ATTESTATION_KEY", "gpuyantra-tests-" + secrets.token_hex(16))
# The suite's own state folder (fixtures that need their own still set theirs), never the user's.
os.environ.setdefault("GPUYANTRA_STATE_DIR", tempfile.mkdtemp(prefix="gpuyantra-tests-state-"))
