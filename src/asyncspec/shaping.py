"""OpenAI's distribution-shaping request fields as one law for the drafter and the target alike:
presence and frequency penalties on the logits, then temperature, then top_p (nucleus) on the
probabilities. The target's shaped law is what a sampled request follows; the drafter's shaped law
is what its candidates are drawn from (so q is the distribution the draft really came from, and
acceptance min(1, p/q) with the residual [p - q]+ keeps the target's shaped law exactly).

Every step is a function of one row and the output before it (its history) alone: a count, an
elementwise subtraction, one row's softmax, and a sort with its cumulative sum inside the row. So
the shaped row never depends on the call that computed the logits, and greedy speculative output
with penalties stays target-only's bit for bit.

Penalties count generated tokens only (not the prompt), as OpenAI documents and vLLM implements:
logit[v] -= frequency_penalty * count(v) + presence_penalty * (count(v) > 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

PENALTY_RANGE = 2.0  # OpenAI's: each penalty within [-2, 2]


@dataclass(frozen=True)
class Shaping:
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def penalises(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def neutral(self) -> bool:
        return not self.penalises and self.top_p >= 1


NEUTRAL = Shaping()


def shaping_problem(top_p, presence_penalty, frequency_penalty) -> str | None:
    """What is wrong with the shaping fields (None: nothing), in OpenAI's ranges."""
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        return f"top_p must be a number in (0, 1], not {top_p!r}"
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not -PENALTY_RANGE <= value <= PENALTY_RANGE:
            return f"{name} must be a number in [-{PENALTY_RANGE:g}, {PENALTY_RANGE:g}], not {value!r}"
    return None


def penalised(logits: torch.Tensor, histories: Sequence[Sequence[int]], shaping: Shaping) -> torch.Tensor:
    """logits float32 [n, V], row i after the generated tokens histories[i]: the penalised logits
    (the input itself when nothing is penalised). Masked (-inf) entries stay masked."""
    if not shaping.penalises:
        return logits
    if len(histories) != logits.shape[0]:
        raise ValueError(f"{len(histories)} histories for {logits.shape[0]} rows")
    vocab = logits.shape[-1]
    rows = []
    for row, history in zip(logits, histories, strict=True):
        counts = torch.bincount(torch.as_tensor(list(history), dtype=torch.long), minlength=vocab)[:vocab].float()
        penalty = counts * shaping.frequency_penalty + (counts > 0).float() * shaping.presence_penalty
        rows.append(row.float() - penalty)
    return torch.stack(rows)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [..., V] -> each row kept on its smallest most-probable set of mass >= top_p (ties in
    probability kept in token order), renormalised. A token is kept when the mass ranked before it
    is below top_p, so the most probable token always is."""
    if top_p >= 1:
        return probs
    order = torch.argsort(probs, dim=-1, descending=True, stable=True)
    ranked = torch.gather(probs, -1, order).double()
    before = torch.cumsum(ranked, dim=-1) - ranked
    keep_ranked = before < top_p
    keep = torch.zeros_like(keep_ranked).scatter(-1, order, keep_ranked)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def shaped_probabilities(
    logits: torch.Tensor, temperature: float, shaping: Shaping, histories: Sequence[Sequence[int]]
) -> torch.Tensor:
    """The sampled law of rows of logits [n, V] (temperature > 0): penalties, softmax(x / T), top_p."""
    probs = torch.softmax(penalised(logits, histories, shaping).float() / temperature, dim=-1)
    return nucleus(probs, shaping.top_p)


def growing_histories(before: Sequence[int], appended: Sequence[int]) -> list[list[int]]:
    """The histories of rows that predict after `before`, then after each of `appended` in turn:
    [before, before + a1, ..., before + a1..an]."""
    base = list(before)
    return [base + list(appended[:i]) for i in range(len(appended) + 1)]
