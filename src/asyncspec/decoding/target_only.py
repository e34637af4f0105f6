"""Target-only decoding: one target call per committed token; the reference every method equals."""

from __future__ import annotations

from asyncspec.decoding.result import DecodeConfig, DecodeResult, DecodeStats, commit_token, output_limit
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.sampling import make_generator, next_token
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
    token = next_token(target, state.next_logits, config.temperature, generator)
    limit = output_limit(request, target)
    while commit_token(token, tokens, target.eos_ids, limit, stats):
        with trace.stage("verify", width=1):
            logits = target.extend(state, [token])
        stats.target_calls += 1
        stats.call_widths.append(1)
        token = next_token(target, logits[-1], config.temperature, generator)
    stats.decode_s = trace.now() - stats.prefill_s
    return DecodeResult(METHOD, tokens, stats, trace)
