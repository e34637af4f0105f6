"""A window's best-of draws decoded side by side (decoding/target_draws.py): rows of several requests
share each call, and every draw is bitwise the draw decoded alone: tokens, log-probabilities,
timestamps. The control: an engine whose rows see each other fails the same comparison."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from asyncspec.decoding.result import DecodeConfig
from asyncspec.decoding.target_draws import decode_target_draws
from asyncspec.decoding.target_only import decode_target_only
from conftest import synthetic_speech, tiny_whisper


def draw_configs(count: int, temperature: float = 1.0) -> list[DecodeConfig]:
    return [DecodeConfig(temperature, seed=11 * draw + 3, positional_sampling=True) for draw in range(count)]


def timed_request(whisper, tokens: int = 40):
    audio = synthetic_speech(2.0, seed=3)
    request = whisper.request(audio, max_new_tokens=tokens, timestamps=True, previous=list(range(400, 420)))
    return replace(request, encoded=whisper.encode_audio(audio))


def alone_and_side_by_side(whisper, request, configs):
    alone = [decode_target_only(whisper, None, request, config) for config in configs]
    return alone, decode_target_draws(whisper, request, configs)


def same_draws(alone, packed) -> bool:
    return all(
        a.tokens == p.tokens and a.stats.logprobs == p.stats.logprobs and a.stats.finish_reason == p.stats.finish_reason
        for a, p in zip(alone, packed, strict=True)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_draws_side_by_side_are_bitwise_the_draws_alone(dtype):
    whisper = tiny_whisper(dtype, seed=12)
    request = timed_request(whisper)
    configs = draw_configs(5)
    alone, packed = alone_and_side_by_side(whisper, request, configs)
    assert same_draws(alone, packed)
    assert len({tuple(draw.tokens) for draw in packed}) > 1  # really sampled: the seeds differ
    assert all(p.stats.prefill_figures == alone[0].stats.prefill_figures for p in packed)  # no-speech p
    assert all(p.stats.notes["decoded_beside"] == 5 for p in packed)
    timestamps = [t for draw in packed for t in draw.tokens if t >= whisper.timestamp_rules.timestamp_begin]
    assert timestamps  # the timestamp rules ran per draw


def test_more_draws_than_a_call_has_rows_split_into_calls_and_stay_equal():
    whisper = tiny_whisper(torch.float32, seed=13)
    configs = draw_configs(whisper.call_width + 3, temperature=0.8)
    alone, packed = alone_and_side_by_side(whisper, timed_request(whisper, tokens=12), configs)
    assert same_draws(alone, packed)


def test_extend_each_gives_each_request_its_own_rows_and_kv():
    whisper = tiny_whisper(torch.float32, seed=14)
    request = timed_request(whisper)
    first = whisper.prefill(request)
    at_prompt = whisper.copy_state(first)
    whisper.extend(first, [50364, 440, 441])  # requests at different lengths share a call
    states = [first, whisper.copy_state(first), at_prompt]
    whisper.extend(states[1], [442])
    alone_states = [whisper.copy_state(state) for state in states]
    tokens = [443, 444, 445]
    packed = whisper.extend_each(states, tokens)
    for state, alone_state, token, row in zip(states, alone_states, tokens, packed, strict=True):
        assert torch.equal(whisper.extend(alone_state, [token])[-1], row)
        assert state.tokens == alone_state.tokens
        for mine, theirs in zip(state.cache.keys, alone_state.cache.keys, strict=True):
            assert torch.equal(mine[:, : state.length], theirs[:, : state.length])


class RowMixingForward:
    """A deliberately wrong engine: each row's hidden state moves with the other rows' ids in its
    call, as a kernel that mixes rows would."""

    def __init__(self, forward):
        self.inner, self.hidden_size = forward, forward.hidden_size

    def new_cache(self, slots, context):
        return self.inner.new_cache(slots, context)

    def __call__(self, slots, ids, prompt=False, widths=None):
        return self.inner(slots, ids, prompt, widths) + 1e-2 * ids[: len(slots)].float().mean() / 1000


def test_the_comparison_fails_on_an_engine_whose_rows_see_each_other():
    whisper = tiny_whisper(torch.float32, seed=12)
    whisper.engine.forward = RowMixingForward(whisper.engine.forward)
    alone, packed = alone_and_side_by_side(whisper, timed_request(whisper), draw_configs(5))
    assert not same_draws(alone, packed)


def test_greedy_configs_are_refused():
    whisper = tiny_whisper(torch.float32, seed=12)
    with pytest.raises(ValueError, match="positional samples"):
        decode_target_draws(whisper, timed_request(whisper), [DecodeConfig()])
