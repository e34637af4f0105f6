"""Fallback draws that have sampled the same tokens share one state and one set of rows
(decoding/draw_sharing.py): every draw stays bitwise its own target-only decode, in fewer rows.
The controls: draws grouped by their length instead of their tokens are no longer exact, and
grouping only the draws still decoding hands a finished draw's rows to them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from asyncspec.decoding import draw_sharing
from asyncspec.decoding.speculative_draws import decode_speculative_draws
from asyncspec.decoding.target_draws import decode_target_draws
from asyncspec.decoding.target_only import decode_target_only
from test_speculative_draws import window
from test_target_draws import draw_configs, same_draws

DECODERS = {
    "target": lambda whisper, request, configs, references: decode_target_draws(whisper, request, configs),
    "speculative": decode_speculative_draws,
}


def rows_fed(draws) -> int:
    return sum(event.meta["width"] for event in draws[0].trace.events if event.stage == "verify")


def decoded(decoder: str, temperature: float, count: int = 5, seed: int = 14):
    whisper, request, references = window(seed=seed)
    configs = draw_configs(count, temperature)
    alone = [decode_target_only(whisper, None, request, config) for config in configs]
    return alone, DECODERS[decoder](whisper, request, configs, references)


@pytest.mark.parametrize("decoder", DECODERS)
def test_draws_that_agree_share_rows_and_stay_bitwise_their_own_decodes(decoder):
    alone, shared = decoded(decoder, temperature=0.3)
    assert same_draws(alone, shared)
    assert len({tuple(draw.tokens) for draw in shared}) == 1  # all five sampled the same tokens...
    assert rows_fed(shared) < sum(len(draw.tokens) for draw in alone) / 2  # ... on one draw's rows


@pytest.mark.parametrize("decoder", DECODERS)
def test_draws_that_part_take_states_of_their_own_and_stay_exact(decoder):
    alone, shared = decoded(decoder, temperature=0.6, count=8)
    assert same_draws(alone, shared)
    assert len({tuple(draw.tokens) for draw in shared}) > 2  # they parted...
    first = [draw.tokens[0] for draw in shared]
    assert len(set(first)) < len(first)  # ... after sharing their first samples


@pytest.mark.parametrize("decoder", DECODERS)
def test_grouping_by_length_instead_of_tokens_breaks_exactness(monkeypatch, decoder):
    monkeypatch.setattr(draw_sharing, "_group_key", lambda draw: (draw.going, len(draw.tokens)))
    alone, shared = decoded(decoder, temperature=0.6, count=8)
    assert not same_draws(alone, shared)


@dataclass
class FakeState:
    tokens: list[int]

    @property
    def length(self) -> int:
        return len(self.tokens)


class FakeTarget:
    def __init__(self):
        self.copies = 0

    def copy_state(self, state: FakeState) -> FakeState:
        self.copies += 1
        return FakeState(list(state.tokens))

    def rollback(self, state: FakeState, length: int) -> None:
        del state.tokens[length:]


@dataclass
class FakeDraw:
    tokens: list[int]
    state: FakeState
    length: int
    going: bool = True


def parted_after_one_call():
    """Two draws that verified one call's rows on one state: the first accepted four and ended,
    the second accepted two and goes on."""
    shared = FakeState([7, 1, 2, 3, 4, 5])
    return FakeDraw([1, 2, 3, 4, 0], shared, 5, going=False), FakeDraw([1, 2, 9], shared, 3)


def test_a_finished_draw_keeps_the_rows_it_verified_on_a_shared_state():
    target = FakeTarget()
    ended, going = parted_after_one_call()
    groups = draw_sharing.share_states(target, [ended, going])
    assert groups == [[going]] and target.copies == 1
    going.state.tokens.append(9)  # the draw still decoding writes its next row
    assert ended.state.tokens == [7, 1, 2, 3, 4] and going.state.tokens == [7, 1, 2, 9]


def test_control_grouping_only_the_draws_still_decoding_loses_a_finished_draws_rows():
    target = FakeTarget()
    ended, going = parted_after_one_call()
    draw_sharing.share_states(target, [going])
    going.state.tokens.append(9)
    assert ended.state.tokens[: ended.length] != [7, 1, 2, 3, 4]
