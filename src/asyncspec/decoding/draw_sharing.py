"""A fallback's draws that have sampled the same tokens so far decode on one state.

At a low fallback temperature a window's draws mostly sample the same tokens (readers.wav's first
fallback: at 0.2 all five draws were the greedy attempt's 105 tokens). A row of the fixed-shape
engine is a function of its request's tokens and positions alone, so draws whose tokens are equal
would compute the same keys, values and logits: one state serves them all, and one row per group
goes into each call instead of one per draw. Where their samples part, each new group keeps a
state of its own: the old one, or a copy of it made before any group rolls it back (a longer
group still needs the rows past a shorter one's length). A draw's rows, tokens and
log-probabilities are therefore bitwise those of its own decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from asyncspec.models.base import DecoderState


class SharingDraw(Protocol):
    tokens: list[int]  # sampled so far; the last one is not in the state yet
    state: DecoderState  # may be shared with other draws until the groups are formed
    length: int  # the positions of `state` that hold this draw's rows (the rest are another draw's)
    going: bool


Draw = TypeVar("Draw", bound=SharingDraw)


def share_states(target, draws: Sequence[Draw]) -> list[list[Draw]]:
    """Group the draws by their tokens; every group gets a state of its own, rolled back to the
    group's length, which all its draws now hold. Returns the groups still decoding, in order.
    `draws` are all of them, finished ones too: a finished draw keeps a state that holds its rows,
    never extended by another (word timestamps read the chosen draw's state afterwards)."""
    groups: dict[tuple, list[Draw]] = {}
    for draw in draws:
        groups.setdefault(_group_key(draw), []).append(draw)
    taken: set[int] = set()
    placed = []
    for group in groups.values():
        free = next((draw.state for draw in group if id(draw.state) not in taken), None)
        state = free if free is not None else target.copy_state(group[0].state)
        taken.add(id(state))
        placed.append((group, state))
    for group, state in placed:  # only now: a copy above may have needed rows past a group's length
        if state.length != group[0].length:
            target.rollback(state, group[0].length)
        for draw in group:
            draw.state = state
    return [group for group, _ in placed if group[0].going]


def _group_key(draw: SharingDraw) -> tuple:
    return draw.going, tuple(draw.tokens)
