"""Several requests decoded side by side, each exactly as it is decoded alone.

A request's search (greedy target-only, a beam search) is written as a generator: it yields the
rows it needs next, [(state, token)], one per hypothesis, and is sent their logits. `drive` runs
any number of such searches in lockstep: every step, the rows of all live searches go into shared
calls of the engine's width (`KVBackend.extend_each`), so the chunks of a batched transcription,
each over its own encoder output, cost about one call a step between them (a call of 8 rows costs
little more than a call of 1 on this engine).

Nothing a search computes depends on its neighbours: a row's logits are those of the call its
request would make alone (models/fixed_shape.py: rows anywhere in a call; forward_whisper.py: rows
over different encoder outputs attend each to their own, at the width of their call alone). To
keep that last width the same, a search's rows are never split across two calls: the searches
are packed whole into calls of at most the engine's width, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import torch

from asyncspec.decoding.result import DecodeResult
from asyncspec.models.base import Decoder, DecoderState

Rows = list[tuple[DecoderState, int]]
# a request's search: yields the rows it needs, is sent their float32 logits [V] in the same
# order, returns its result
Search = Generator[Rows, list[torch.Tensor], DecodeResult]
# (target, states, tokens) -> the logits after tokens[i] appended to states[i], one row each
RowCalls = Callable[[Decoder, Sequence[DecoderState], Sequence[int]], list[torch.Tensor]]


def packed(target, states: Sequence[DecoderState], tokens: Sequence[int]) -> list[torch.Tensor]:
    """The rows side by side in calls of the engine's width."""
    return target.extend_each(states, tokens)


def one_call_per_row(target, states: Sequence[DecoderState], tokens: Sequence[int]) -> list[torch.Tensor]:
    """Each row in a call of its own (the reference the packed calls must equal)."""
    return [target.extend(state, [token])[-1] for state, token in zip(states, tokens, strict=True)]


def proven_calls(target) -> RowCalls:
    """`packed` where the invariance self-test proved a row's logits the same in any call on this
    machine, else `one_call_per_row`: slower, the same results."""
    from asyncspec.models.selftest import invariance

    return packed if target.call_width is not None and invariance(target).passed else one_call_per_row


def drive(target, searches: Sequence[Search], calls: RowCalls | None = None) -> list[DecodeResult]:
    """Every search run to its end, their rows side by side (`calls`, default `packed`; the
    transformers engine, which has no shared calls, one call per row). Results in the searches' order."""
    calls = calls or (packed if target.call_width is not None else one_call_per_row)
    results: list[DecodeResult | None] = [None] * len(searches)
    pending: dict[int, Rows] = {}
    for index, search in enumerate(searches):
        _advance(search, index, None, pending, results)
    while pending:
        for group in _calls(list(pending), pending, target.call_width):
            rows = [row for index in group for row in pending[index]]
            logits = calls(target, [state for state, _ in rows], [token for _, token in rows])
            done = 0
            for index in group:
                mine, done = logits[done : done + len(pending[index])], done + len(pending[index])
                _advance(searches[index], index, mine, pending, results)
    if any(result is None for result in results):
        raise RuntimeError("a search ended without a result")
    return [result for result in results if result is not None]


def _advance(search: Search, index: int, logits, pending: dict[int, Rows], results: list) -> None:
    try:
        rows = next(search) if logits is None else search.send(logits)
    except StopIteration as stop:
        results[index] = stop.value
        pending.pop(index, None)
        return
    if not rows:
        raise RuntimeError("a search asked for no rows")
    pending[index] = rows


def _calls(order: list[int], pending: dict[int, Rows], width: int | None) -> list[list[int]]:
    """The searches cut into calls, each whole and in order: a call holds searches while their
    rows fit `width`; a search wider than that has calls of its own (extend_each cuts them as it
    would alone)."""
    if width is None:
        return [order]
    groups: list[list[int]] = []
    used = width
    for index in order:
        rows = len(pending[index])
        if used + rows > width:
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += rows
    return groups
