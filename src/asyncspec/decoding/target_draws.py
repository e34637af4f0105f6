"""Several positional samples of one request, decoded side by side: a long-form window's best-of
draws at a fallback temperature.

Each draw is target-only decoding with its own seed (target_only.py). The prompt is prefilled once;
then every step carries one row per group of unfinished draws that have sampled the same tokens
(draw_sharing.py), packed into calls of the engine's width (`KVBackend.extend_each`). A row's
logits never depend on the call it is in, so every draw's tokens and log-probabilities are bitwise
those of its own `decode_target_only`, and every speculative method's positional sample equals
them too. What changes is the cost: five draws take about one draw's calls instead of five
(faster-whisper samples its best-of as one batch as well), and draws that agree share their rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from asyncspec.decoding.draw_sharing import share_states
from asyncspec.decoding.result import (
    DecodeConfig,
    DecodeResult,
    DecodeStats,
    commit_token,
    observe_prefill,
    output_limit,
)
from asyncspec.decoding.target_only import METHOD
from asyncspec.models.base import DecodeRequest, DecoderState
from asyncspec.sampling import decide, token_logprob
from asyncspec.trace import Trace


@dataclass
class _Draw:
    config: DecodeConfig
    state: DecoderState
    length: int
    row: torch.Tensor  # the logits that decide its next token
    tokens: list[int] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)
    going: bool = True


def decode_target_draws(target, request: DecodeRequest, configs: Sequence[DecodeConfig]) -> list[DecodeResult]:
    """One DecodeResult per config (positional sampling only), in order; each equals
    `decode_target_only(target, None, request, config)`. The calls' time is shared out evenly."""
    trace = Trace()
    prefilled = prefilled_draws(target, request, configs, trace)
    draws = [_Draw(config, prefilled, prefilled.length, prefilled.next_logits) for config in configs]
    limit, prefill_s = output_limit(request, target), trace.now()
    while True:
        for draw in draws:
            if draw.going:
                token = decide(target, draw.row[None], draw.config.temperature, draw.config.seed, len(draw.tokens))[0]
                draw.stats.logprobs.append(token_logprob(draw.row, token))
                draw.going = commit_token(token, draw.tokens, target.eos_ids, limit, draw.stats)
        groups = share_states(target, draws)  # draws with the same tokens: one row for all
        if not groups:
            break
        with trace.stage("verify", width=len(groups)):
            rows = target.extend_each([group[0].state for group in groups], [group[0].tokens[-1] for group in groups])
        for group, row in zip(groups, rows, strict=True):
            for draw in group:
                draw.stats.target_calls += 1
                draw.stats.call_widths.append(1)
                draw.row, draw.length = row, draw.state.length
    share_out([draw.stats for draw in draws], prefilled, prefill_s, trace.now() - prefill_s)
    return [DecodeResult(METHOD, draw.tokens, draw.stats, trace) for draw in draws]


def prefilled_draws(target, request: DecodeRequest, configs: Sequence[DecodeConfig], trace: Trace) -> DecoderState:
    """The prompt prefilled once: every draw starts on this state (draw_sharing.py copies it where
    their samples part)."""
    if any(not config.positional_sampling or config.temperature <= 0 for config in configs):
        raise ValueError("draws side by side are positional samples at a temperature above 0")
    with trace.stage("prefill"):
        return target.prefill(request)


def share_out(stats: Sequence[DecodeStats], prefilled, prefill_s: float, decode_s: float) -> None:
    """Every draw's figures: the shared prefill's, and an even share of the shared calls' time."""
    for draw in stats:
        observe_prefill(draw, prefilled)
        draw.prefill_s, draw.decode_s = prefill_s / len(stats), decode_s / len(stats)
        draw.notes["decoded_beside"] = len(stats)
