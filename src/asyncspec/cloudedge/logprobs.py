"""OpenAI's `logprobs`: the target's log-probability of each emitted token and its top alternatives,
carried in verdicts only when the request asked for them (Open.logprobs >= 0: that many alternatives).

The law is the one each token was decided from (vLLM's "processed" log-probabilities): for a greedy
request log_softmax of the penalised logits, for a sampled one the log of the shaped law p
(temperature, penalties, top_p; shaping.py). Of a token the cloud decided (an accepted candidate, the
greedy or bonus token, a rejection it settled) the verdict carries the value; of a token the edge
settled after a sampled rejection, the edge already holds p(token) from what the cloud sent to settle
it (the support, the proposals or the whole p), so no round trip is added. Each row's alternatives
(ids, log-probabilities, most probable first, ties by id) come with the verdict, the rejected row's too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from asyncspec.cloudedge import protocol as wire

NOT_ASKED = -1


@dataclass(frozen=True)
class TokenLogprob:
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, log-probability), most probable first


def law_log(rows: torch.Tensor, greedy: bool) -> torch.Tensor:
    """log of the law the tokens were decided from: rows are the penalised logits when greedy, the
    shaped probabilities p otherwise."""
    return torch.log_softmax(rows.float(), dim=-1) if greedy else torch.log(rows.float())


def attach(verdict: wire.Verdict, log_law: torch.Tensor, candidates: list[int], top: int) -> wire.Verdict:
    """The verdict with the log-probabilities of the tokens it decides (accepted candidates, then the
    next token when it names one) and `top` alternatives for each row up to the first not accepted."""
    if top == NOT_ASKED:
        return verdict
    decided = [*candidates[: verdict.accepted], *([verdict.token] if verdict.token >= 0 else [])]
    values = torch.stack([log_law[i, token] for i, token in enumerate(decided)]) if decided else torch.zeros(0)
    rows = log_law[: verdict.accepted + 1]
    order = torch.argsort(rows, dim=-1, descending=True, stable=True)[:, :top]
    return replace(
        verdict,
        logprobs=wire.pack_probs(values),
        top_ids=wire.pack_ids(order.reshape(-1).tolist()),
        top_logprobs=wire.pack_probs(torch.gather(rows, 1, order).reshape(-1)),
    )


def unpack(verdict: wire.Verdict, top: int) -> tuple[list[float], list[tuple[tuple[int, float], ...]]]:
    """(the decided tokens' values, each row's alternatives); ValueError when the counts disagree."""
    values = wire.unpack_probs(verdict.logprobs).tolist()
    ids = wire.unpack_ids(verdict.top_ids)
    top_values = wire.unpack_probs(verdict.top_logprobs).tolist()
    rows = verdict.accepted + 1
    if len(values) != verdict.accepted + (verdict.token >= 0) or len(ids) != len(top_values) or len(ids) % rows:
        raise ValueError("the cloud's log-probabilities do not match its verdict")
    width = len(ids) // rows
    if width > top:
        raise ValueError("the cloud sent more alternatives than asked")
    pairs = list(zip(ids, top_values, strict=True))
    return values, [tuple(pairs[r * width : (r + 1) * width]) for r in range(rows)]


def of_tokens(
    values: list[float], tops: list[tuple[tuple[int, float], ...]], settled_p: float | None
) -> list[TokenLogprob]:
    """Each decided token's TokenLogprob; `settled_p` is p of the token the edge settled after a
    rejection (its value is not in the verdict)."""
    out = [TokenLogprob(value, tops[i]) for i, value in enumerate(values)]
    if settled_p is not None:
        out.append(TokenLogprob(math.log(settled_p) if settled_p > 0 else -math.inf, tops[len(values)]))
    return out
