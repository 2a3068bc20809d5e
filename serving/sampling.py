"""Choosing each row's token from a pass's logits: the argmax or a sample (temperature, top-p, the
request's own generator), and the log-probabilities a request asked for. Pure functions of the
logits and the rows' requests, shared by every kind of step the scheduler runs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from serving.request import GenRequest, _Slot


def choose_tokens(logits: torch.Tensor, slots: Sequence[_Slot | None], greedy: torch.Tensor | None = None) -> list[int]:
    """Each row's token: the argmax (`greedy`, when the step computed it already), or a sample."""
    out: list[int] = (logits.argmax(dim=-1) if greedy is None else greedy).tolist()
    for r, slot in enumerate(slots):
        if slot is None or slot.request.temperature <= 0:
            continue
        req = slot.request
        probs = torch.softmax(logits[r].float() / max(req.temperature, 1e-5), dim=-1).cpu()
        if req.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < req.top_p
            keep[0] = True
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
        out[r] = int(torch.multinomial(probs, 1, generator=slot.generator))
    return out


def greedy_request(req: GenRequest) -> bool:
    """The request takes the argmax token and wants no logprobs (a graph step's token suffices)."""
    return req.temperature <= 0 and not req.logprobs


def token_logprobs(
    logits: torch.Tensor, wanted: Sequence[int | None], chosen: Sequence[int]
) -> list[tuple[float, list[tuple[int, float]]] | None]:
    """Per row r of `logits` [rows, V]: None when wanted[r] is None, else (log-probability of
    chosen[r], the wanted[r] most likely (token id, log-probability), most likely first), from
    log_softmax of the logits in float32."""
    out: list[tuple[float, list[tuple[int, float]]] | None] = [None] * len(wanted)
    rows = [r for r, k in enumerate(wanted) if k is not None]
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    logp = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    picked = logp.gather(1, torch.tensor([[int(chosen[r])] for r in rows], device=logits.device))[:, 0].tolist()
    k = min(max(int(wanted[r]) for r in rows), logp.shape[-1])  # type: ignore[arg-type]
    top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
    values, ids = top_values.tolist(), top_ids.tolist()
    for j, r in enumerate(rows):
        want = int(wanted[r])  # type: ignore[arg-type]
        out[r] = (picked[j], list(zip(ids[j][:want], values[j][:want])))
    return out
