"""The invariance self-test's batch check: whether requests' blocks may share one wide call.

Blocks stacked into calls of 2, 4, ... blocks, and rows packed into such calls with no padding
between them, compared bit for bit with each request's own calls: a float kernel may block a wide
call differently from an 8-row one (AMX bf16 rounded 64-row calls differently, 2026-12-04). The
cloud stacks requests, and a transcriber's fallback draws pack their rows, only as wide as this
proved (selftest.InvarianceReport.stacking).
"""

from __future__ import annotations

import time

import torch

from asyncspec.models.base import DecoderState, call_width
from asyncspec.models.call_stacks import stack_sizes
from asyncspec.models.row_probe import compare_rows, kv_rows, probe_tokens
from asyncspec.models.threads import torch_threads


def stacked_probe(backend, most_blocks: int) -> list[list[int]]:
    """Requests' token lists whose blocks fill calls of 2, 4, ... `most_blocks` blocks exactly (the
    first k - 1 lists make k blocks): the first spans two blocks, so its second block reads its
    first's keys/values inside one call; the others fill 8, 7 or 6 of their block's rows, so
    padding rows sit between real ones. More lists follow until their rows fill the widest call
    packed (`_packed_difference`)."""
    width = call_width(backend) or 8
    most = stack_sizes(most_blocks)[-1]
    lengths = [width + 3]
    while len(lengths) < most - 1 or sum(lengths) < most * width:
        lengths.append(width - (len(lengths) - 1) % 3)
    stream = probe_tokens(backend, sum(lengths))
    starts = [sum(lengths[:index]) for index in range(len(lengths))]
    return [stream[start : start + length] for start, length in zip(starts, lengths, strict=True)]


def batch_check(backend, context, most_blocks: int | None, wide_threads: int | None) -> dict:
    """The report's stacked_* fields (none when no check is asked), at the current thread count and
    at `wide_threads` if given: the largest stack proven at both, the first difference at either."""
    if most_blocks is None or most_blocks < 2:
        return {}
    started = time.perf_counter()
    counts = (torch.get_num_threads(), *(() if wide_threads is None else (wide_threads,)))
    proven, difference = most_blocks, ""
    for count in counts:
        with torch_threads(count):
            found, problem = _stacked_check(backend, context, most_blocks)
        proven = min(proven, found)
        if problem and not difference:
            difference = problem if count == counts[0] else f"at {count} threads, {problem}"
    return {
        "stacked_blocks": most_blocks,
        "stacked_equal": not difference,
        "stacked_difference": difference,
        "stacked_proven": proven,
        "stacked_seconds": round(time.perf_counter() - started, 3),
        "stacked_threads": counts,
    }


def _stacked_check(backend, context, most_blocks: int) -> tuple[int, str]:
    """Each probe request's tokens through `extend`, a call of its own per block (the per-request
    path), then again stacked with the others' in calls of 2, 4, ... `most_blocks` blocks, from
    empty caches (a row's position changes only its attention, which is per row); every row's
    logits and KV compared bit for bit. Each stack size is also run packed (`_packed_difference`).
    (the largest stack equal, with every smaller one; the first difference, "" when all are equal).
    Costs one call per block alone, plus two calls of each stacked width (with 8: eight 8-row
    calls, then calls of 16, 32 and 64 rows)."""
    if getattr(backend, "engine", None) is None:
        return 0, "no fixed-shape engine"
    parts = stacked_probe(backend, most_blocks)
    alone_states = _empty_states(backend, context, len(parts))
    alone = [backend.extend(state, tokens) for state, tokens in zip(alone_states, parts, strict=True)]
    proven = 0
    for blocks in stack_sizes(most_blocks):
        states = _empty_states(backend, context, blocks - 1)
        stacked = backend.extend_stacked(states, parts[: blocks - 1], blocks)
        for index, (rows, state) in enumerate(zip(stacked, states, strict=True)):
            differing, kv = compare_rows(alone[index], kv_rows(alone_states[index]), rows, state, len(rows))
            if differing or kv:
                where = f"row {differing[0]} differs from its own call's" if differing else "keys/values differ"
                return proven, f"a call of {blocks} stacked blocks: request {index}'s {where}"
        problem = _packed_difference(backend, context, parts, alone, alone_states, blocks)
        if problem:
            return proven, problem
        proven = blocks
    return proven, ""


def _packed_difference(backend, context, parts, alone, alone_states, blocks: int) -> str:
    """Probe requests packed row after row into one call of `blocks` blocks with no padding between
    them (KVBackend.extend_packed: a window's fallback draws with their candidates), so that every
    row index of the wide call holds a real row; each compared with its own calls. "" when equal."""
    width = call_width(backend) or 8
    taken, lengths = 0, []
    for tokens in parts:
        lengths.append(min(len(tokens), blocks * width - taken))
        taken += lengths[-1]
        if taken == blocks * width:
            break
    states = _empty_states(backend, context, len(lengths))
    packed = backend.extend_packed(states, [p[:n] for p, n in zip(parts, lengths, strict=False)], blocks)
    for index, (rows, state) in enumerate(zip(packed, states, strict=True)):
        reference_kv = [t[:, : state.length] for t in kv_rows(alone_states[index])]
        differing, kv = compare_rows(alone[index], reference_kv, rows, state, len(rows))
        if differing or kv:
            where = f"row {differing[0]} differs from its own call's" if differing else "keys/values differ"
            return f"a packed call of {blocks} blocks: request {index}'s {where}"
    return ""


def _empty_states(backend, context, count: int) -> list[DecoderState]:
    """Fresh requests of the fixed-shape engine; an encoder-decoder's share one cross-attention
    memory, as a window's draws do (its rows may share a call only then), computed once."""
    first = backend._new_state(0, context)
    states = [first] + [DecoderState([], 0, first.cache.sibling(), None) for _ in range(count - 1)]
    for state in states:
        if context is not None:
            state.extras["encoded"] = context
    return states
