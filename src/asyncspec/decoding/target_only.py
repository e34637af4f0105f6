"""Target-only decoding: one target call per committed token; the reference every method equals."""

from __future__ import annotations

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
            logits = target.extend(state, [token])[-1]
        stats.target_calls += 1
        stats.call_widths.append(1)
    stats.decode_s = trace.now() - stats.prefill_s
    return DecodeResult(METHOD, tokens, stats, trace)
