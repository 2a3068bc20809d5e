"""Request and response bodies of the admin API (`serving/routes_admin.py`), as the OpenAPI schema
declares them. Strict where JSON could be misread: `true` or `"5"` is no integer here. The answers of
`/admin/profile` and `/admin/benchmark` are left free-form: their keys follow what is measured
(docs/CONTRACTS.md section 5 names the ones a client can rely on)."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from gpuyantra.swap.records import SwapRecord
from serving.openai_api import ValidationErrorBody, ValidationIssue


class Attestation(BaseModel):
    """The verifier's signed record of an accepted candidate: the verdict's `attestation`, as is."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: JSON true or "5" is no integer

    digest: str = Field(
        ..., pattern="^[0-9a-f]{64}$", description="SHA-256 (hex) of the candidate file's bytes the verifier read"
    )
    op: str = Field(..., description="the candidate's OP, as the verifier read it")
    reward: int = Field(..., description="the verdict's reward; only +1 and above are swapped")
    device: str = Field(..., description="where it was verified (cpu or cuda); must be the server's device")
    signature: str = Field(
        ...,
        pattern="^[0-9a-f]{64}$",
        description="HMAC-SHA256 (hex), under the key shared by workers and server, of "
        "the canonical JSON of {digest, op, reward, device}",
    )


class AttestationCheckBody(BaseModel):
    """A signed nonce: would this server accept attestations signed with the sender's key?"""

    model_config = ConfigDict(extra="forbid", strict=True)

    nonce: str = Field(..., pattern="^[0-9a-f]{32,128}$", description="a fresh random value (hex)")
    signature: str = Field(
        ...,
        pattern="^[0-9a-f]{64}$",
        description="HMAC-SHA256 (hex) of the nonce under the sender's attestation key (gpuyantra/attestation.py)",
    )
    key: str | None = Field(
        None, pattern="^[0-9a-f]{16}$", description="the fingerprint of the sender's key, named in a 403's detail"
    )


class AttestationCheckAnswer(BaseModel):
    """200: the signature is the server's own; 403 (`detail` one line): the sender's key is not the server's."""

    detail: str | None = None
    accepted: bool = Field(..., description="whether the server would accept attestations signed with that key")
    key: str = Field(..., description="the fingerprint of the key the server checks attestations with")
    key_source: str = Field(
        ..., description="where the server's key comes from: $GPUYANTRA_ATTESTATION_KEY or its state folder's file"
    )
    unverified_swaps_allowed: bool = Field(..., description="the server runs with --allow-unverified-swaps")


class RowsGate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    kernel: list[Annotated[int, Field(ge=1)]] = Field(..., description="row counts the kernel serves")
    original: list[Annotated[int, Field(ge=1)]] = Field(
        ..., min_length=1, description="row counts the original forward serves"
    )


class SwapBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    source: str | None = Field(None, description="the candidate file's text")
    path: str | None = Field(None, description="absolute path of a candidate .py file")
    module_class: str | None = Field(None, description="restrict the swap to this class (name or dotted)")
    param_shapes: dict[str, list[int] | None] | None = Field(
        None,
        description="restrict the swap to modules whose parameters have these live shapes (a profile "
        'target\'s `param_shapes`, e.g. {"weight": [2048, 1536], "bias": null} for one linear projection)',
    )
    shapes: list[list[int]] | None = Field(
        None, description="input shapes to check parity on, instead of the shapes seen in live traffic"
    )
    rows_gate: RowsGate | None = Field(
        None,
        description="row counts at which the verdict timed the kernel faster (`kernel`) and not faster "
        "(`original`): each call is served by whichever won at the timed row count nearest its own",
    )
    attestation: Attestation | None = Field(
        None,
        description="the verdict's attestation of exactly these bytes; required unless the server runs "
        "with --allow-unverified-swaps",
    )

    @model_validator(mode="after")
    def _one_source(self):
        if (self.source is None) == (self.path is None):
            raise ValueError(
                "give exactly one of 'source' (the candidate file's text) or 'path' "
                "(an absolute path to a candidate .py file)"
            )
        if self.source is not None and not self.source.strip():
            raise ValueError("'source' is empty")
        if self.path is not None and not os.path.isabs(self.path):
            raise ValueError(f"'path' must be absolute, got {self.path!r}")
        if self.shapes is not None:
            if not self.shapes or len(self.shapes) > 16:
                raise ValueError("'shapes' takes 1 to 16 shapes")
            for s in self.shapes:
                if len(s) < 2 or any(d < 1 for d in s):
                    raise ValueError(f"each shape needs at least 2 positive dims (rows..., hidden), got {s}")
        return self


class SwapRefusalDetail(BaseModel):
    status: str = Field(
        ...,
        description="a swap: forbidden, invalid_candidate, rejected or rolled_back; a rollback: unknown, "
        "not_active or rejected",
    )
    reason: str = Field(..., description="one line saying why nothing was swapped or rolled back")
    swap_id: str | None = None
    parity: dict[str, Any] | None = None


class SwapRefusal(BaseModel):
    """Body of a swap or rollback the swap engine refused (403, 404, 409; a candidate that does not load: 422)."""

    detail: SwapRefusalDetail


class RequestErrorBody(BaseModel):
    """422 of the admin routes: a body that failed validation (`detail`: FastAPI's list of issues) or a
    request that cannot be served as asked (`detail`: one line); `message`: one readable line."""

    detail: list[ValidationIssue] | str
    message: str


class SwapUnprocessable(BaseModel):
    """422 of /admin/swap: a body that failed validation (`detail`: the list, with `message`), or a candidate
    that does not load (`detail`: the swap engine's refusal, as in 403 and 409)."""

    detail: list[ValidationIssue] | SwapRefusalDetail
    message: str | None = None


UNPROCESSABLE: dict[int | str, dict[str, Any]] = {
    422: {"model": RequestErrorBody, "description": "invalid body, or a request that cannot be served"}
}
INVALID_BODY: dict[int | str, dict[str, Any]] = {422: {"model": ValidationErrorBody, "description": "malformed body"}}


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    swap_id: str | None = Field(None, min_length=1)
    all: bool | None = None

    @model_validator(mode="after")
    def _one_target(self):
        if (self.swap_id is None) == (not self.all):
            raise ValueError("give either 'swap_id' or 'all': true (not both)")
        return self


class ProfileBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LogitsBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str | list[StrictInt] = Field(..., min_length=1)


class GenerationBody(BaseModel):
    """The generations a served-speed measurement times (/admin/benchmark, /admin/compare)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_tokens: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="tokens generated per generation; prompt_tokens + max_tokens must fit the context",
    )
    prompt_tokens: int = Field(default=8, ge=1, le=32768, description="prompt length of each generation")


class BenchmarkBody(GenerationBody):
    batch: int = Field(default=1, ge=1, le=1024, description="rows decoded together, at most the server's max_batch")
    repeats: int = Field(
        default=5,
        ge=1,
        le=20,
        description="timed repeats; the answer gives their median "
        "tokens/s and spread (tokens_per_s_min/_max, relative_spread = (max - min) / median, "
        "relative_mad)",
    )
    min_repeat_s: float = Field(
        default=0.25,
        ge=0.0,
        le=5.0,
        description="each repeat generates again until it "
        "has run this many seconds, so a repeat is not mostly timer and launch noise; the "
        "server serves nothing else for about repeats x min_repeat_s",
    )
    mode: Literal["auto", "benchmark", "live"] = Field(
        default="auto",
        description="how to measure: `live` observes the next live_window_s of served decode steps "
        "at `batch` rows without pausing traffic (409 when too few come); `benchmark` pauses traffic "
        "for a bounded generation; `auto` (default) measures live when traffic is decoding at `batch` "
        "rows, else benchmarks. The answer's `measured` says which",
    )
    live_window_s: float = Field(
        default=3.0, ge=0.5, le=30.0, description="seconds of live traffic observed when measuring live"
    )
    min_live_steps: int = Field(
        default=30, ge=5, le=100000, description="decode steps at `batch` rows a live measurement needs"
    )


class CompareBody(GenerationBody):
    swap_id: str = Field(..., min_length=1, description="the active swap to turn off and on again")
    batches: list[StrictInt] = Field(
        default=[1], min_length=1, max_length=8, description="decode batches measured in each phase"
    )
    rounds: int = Field(
        default=3,
        ge=2,
        le=10,
        description="pairs of phases (with and without the swap, order alternating); their paired "
        "differences are the answer's `drops`",
    )
    repeats: int = Field(default=2, ge=1, le=20, description="timed repeats per phase and batch")
    min_repeat_s: float = Field(
        default=0.2,
        ge=0.0,
        le=5.0,
        description="each repeat generates again until it has run this long; the server serves "
        "nothing else for about 2 x rounds x len(batches) x repeats x min_repeat_s, plus one CUDA-graph "
        "capture per side",
    )


# ====================================================================== answers
class KernelsAnswer(BaseModel):
    model: str
    active: list[SwapRecord] = Field(..., description="the swaps bound now")
    history: list[SwapRecord] = Field(..., description="every swap of this server, in order")
    fallbacks: int = Field(..., description="calls of swapped kernels that fell back to the original forward")
    graphs: dict[str, Any] | None = Field(
        ...,
        description="the CUDA graphs captured (null without --cuda-graphs); `prefill`: the one-row "
        "prefill graphs (null with --no-prefill-graphs); `mixed`: mixed steps (prompt_tokens, admissions, "
        "extra_ms the mixed graph adds to a decode step, interrupting_prefill_ms the median prefill pass it "
        "is weighed against, interrupting_prefill_rows the rows of the recent such passes); "
        "`mixed_fed_steps`: mixed steps queued behind a step running ahead, their decode rows fed on the device; "
        "`decode_timing`: the host's cycle over recent decode steps run ahead, medians in ms (cycle_ms, "
        "wait_ms of it waiting for the GPU, host_ms the rest, cycle_p90_ms; queued_from_host: steps "
        "queued before the previous one's tokens were handed out, where a joining row kept them from running "
        "ahead; null before any)",
    )
    state_dir: str
    manifest: str = Field(..., description="the file the kept swaps are re-applied from at startup")


class SwapAnswer(BaseModel):
    swap_id: str
    op: str
    module_class: str | None
    qualified_class: str | None
    modules: int = Field(..., description="how many modules the kernel was bound into")
    parity: dict[str, Any] = Field(..., description="the parity check on the live weights")
    status: str = Field(..., description="committed")
    file: str = Field(..., description="where the server keeps the candidate's bytes")
    digest: str = Field(..., description="SHA-256 (hex) of those bytes")


class RollbackAnswer(BaseModel):
    rolled_back: list[SwapRecord]
    active: list[SwapRecord] = Field(..., description="the swaps still bound")


class LogitsAnswer(BaseModel):
    model: str
    tokens: int = Field(..., description="the prompt's length in tokens")
    logits: list[float] = Field(..., description="the last position's logits, one per vocabulary entry")
