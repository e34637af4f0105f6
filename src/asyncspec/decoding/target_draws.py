"""Several positional samples of one request, decoded side by side: a long-form window's best-of
draws at a fallback temperature.

Each draw is target-only decoding with its own seed (target_only.py). The prompt is prefilled once
and copied; then every step carries one row per unfinished draw, packed into calls of the engine's
width (`KVBackend.extend_each`). A row's logits never depend on the call it is in, so every draw's
tokens and log-probabilities are bitwise those of its own `decode_target_only`, and every
speculative method's positional sample equals them too. What changes is the cost: five draws take
about one draw's calls instead of five (faster-whisper samples its best-of as one batch as well).
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncspec.decoding.result import (
    DecodeConfig,
    DecodeResult,
    DecodeStats,
    commit_token,
    observe_prefill,
    output_limit,
)
from asyncspec.decoding.target_only import METHOD
from asyncspec.models.base import DecodeRequest
from asyncspec.sampling import decide, token_logprob
from asyncspec.trace import Trace


def decode_target_draws(target, request: DecodeRequest, configs: Sequence[DecodeConfig]) -> list[DecodeResult]:
    """One DecodeResult per config (positional sampling only), in order; each equals
    `decode_target_only(target, None, request, config)`. The calls' time is shared out evenly."""
    trace = Trace()
    states = prefilled_draws(target, request, configs, trace)
    prefilled = states[0]
    stats = [DecodeStats() for _ in configs]
    tokens: list[list[int]] = [[] for _ in configs]
    logits = {index: state.next_logits for index, state in enumerate(states)}
    limit, prefill_s = output_limit(request, target), trace.now()
    while logits:
        going = []
        for index, row in logits.items():
            config = configs[index]
            token = decide(target, row[None], config.temperature, config.seed, len(tokens[index]))[0]
            stats[index].logprobs.append(token_logprob(row, token))
            if commit_token(token, tokens[index], target.eos_ids, limit, stats[index]):
                going.append(index)
        if not going:
            break
        with trace.stage("verify", width=len(going)):
            rows = target.extend_each([states[i] for i in going], [tokens[i][-1] for i in going])
        for index in going:
            stats[index].target_calls += 1
            stats[index].call_widths.append(1)
        logits = dict(zip(going, rows, strict=True))
    share_out(stats, prefilled, prefill_s, trace.now() - prefill_s)
    return [DecodeResult(METHOD, tokens[i], stats[i], trace) for i in range(len(configs))]


def prefilled_draws(target, request: DecodeRequest, configs: Sequence[DecodeConfig], trace: Trace) -> list:
    """One state per draw: the prompt prefilled once (the first state), then copied."""
    if any(not config.positional_sampling or config.temperature <= 0 for config in configs):
        raise ValueError("draws side by side are positional samples at a temperature above 0")
    with trace.stage("prefill"):
        prefilled = target.prefill(request)
    return [prefilled] + [target.copy_state(prefilled) for _ in configs[1:]]


def share_out(stats: Sequence[DecodeStats], prefilled, prefill_s: float, decode_s: float) -> None:
    """Every draw's figures: the shared prefill's, and an even share of the shared calls' time."""
    for draw in stats:
        observe_prefill(draw, prefilled)
        draw.prefill_s, draw.decode_s = prefill_s / len(stats), decode_s / len(stats)
        draw.notes["decoded_beside"] = len(stats)
