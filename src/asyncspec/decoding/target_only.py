"""Target-only decoding: one target call per committed token; the reference every method equals."""

from __future__ import annotations

from asyncspec.decoding.lockstep import Search, drive, one_call_per_row, proven_calls
from asyncspec.decoding.result import (
    DecodeConfig,
    DecodeResult,
    DecodeStats,
    commit_token,
    observe_prefill,
    output_limit,
)
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.sampling import decide, make_generator, next_token, token_logprob
from asyncspec.shaping import penalised
from asyncspec.trace import Trace

METHOD = "target"
GREEDY = DecodeConfig()


def decode_target_only(
    target: Decoder, drafter: Decoder | None, request: DecodeRequest, config: DecodeConfig = GREEDY
) -> DecodeResult:
    return drive(target, [target_only_search(target, request, config)], one_call_per_row)[0]


def decode_target_batch(target: Decoder, requests: list[DecodeRequest], config: DecodeConfig = GREEDY):
    """Each request decoded as `decode_target_only` decodes it, their rows side by side in shared
    calls (decoding/lockstep.py): bitwise each one's result alone."""
    searches = [target_only_search(target, request, config) for request in requests]
    return drive(target, searches, proven_calls(target))


def target_only_search(target: Decoder, request: DecodeRequest, config: DecodeConfig = GREEDY) -> Search:
    """The request's target-only decoding as a lockstep search: one row a step."""
    trace, stats, tokens = Trace(), DecodeStats(), list[int]()
    generator = make_generator(config.seed)
    with trace.stage("prefill"):
        state = target.prefill(request)
    stats.prefill_s = trace.now()
    observe_prefill(stats, state)
    logits = state.next_logits
    limit = output_limit(request, target)
    while True:
        shaped = penalised(logits[None], [tokens], config.shaping)[0]
        if config.positional_sampling:
            token = decide(target, shaped[None], config.temperature, config.seed, len(tokens))[0]
        else:
            token = next_token(target, shaped, config.temperature, generator, config.shaping.top_p)
        stats.logprobs.append(token_logprob(logits, token))
        if not commit_token(token, tokens, target.eos_ids, limit, stats):
            break
        with trace.stage("verify", width=1):
            logits = (yield [(state, token)])[0]
        stats.target_calls += 1
        stats.call_widths.append(1)
    stats.decode_s = trace.now() - stats.prefill_s
    return DecodeResult(METHOD, tokens, stats, trace)
