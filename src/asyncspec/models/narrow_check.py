"""The invariance self-test's narrow check: may a decoding call run fewer rows than the engine's
width?

A fixed-shape call pads its rows up to `width`, so a one-token step pays for `width` rows:
whisper-base int8 on two threads of a Zen 4 capped to AVX-512 VNNI, 14.3 ms a call at 8 rows
against 11.8 ms at 1. Where every step of a call is a function of the row alone at any width
(the int8 engine: integer products, per-row scales, attention row by row), a narrower call gives
the same bits; but that holds where the kernels make it so, so it is checked where the target
runs, as the rest of the self-test is. For each width below the engine's (1, 2, 3, ...) the probe
sequence is decoded in calls that all run at that width and compared bit for bit, rows and
keys/values, with the full-width calls, at every thread count the target decodes at.

Only the int8 engine is checked, because only there is the check confirming a construction rather
than sampling luck: a float GEMM's blocking follows the call's rows, and whisper-base bf16 passed
this probe on a Zen 4 yet gave other bits at 1-row calls on a LibriVox clip. A float engine's
short calls stay padded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from asyncspec.models.row_probe import compare_rows
from asyncspec.models.threads import torch_threads


def narrower_widths(width: int) -> list[int]:
    """The widths a short decoding call may run at, if proven: every width below `width`. Each
    costs the check one probe decode per thread count (the whole self-test of whisper-base int8
    took 2.1-2.9 s with seven widths on a 2-core Zen 2, once per machine), and a call of five rows
    (a fallback's five draws side by side) then runs at 5, not 8 (there: 13.4 against 15.5 ms)."""
    return list(range(1, width))


def sizes_within(width: int, n: int) -> list[int]:
    """Call sizes 1, 2, ..., `width`, 1, 2, ... summing to `n`: every call fits in `width` rows, and
    each row index of such a call holds a real row in some call."""
    sizes: list[int] = []
    size = 1
    while sum(sizes) < n:
        sizes.append(min(size, n - sum(sizes)))
        size = size % width + 1
    return sizes


@contextmanager
def full_width(engine) -> Iterator[None]:
    """Every call at the engine's full width while the block runs (the self-test's own calls)."""
    if engine is None or not hasattr(engine, "narrow"):
        yield
        return
    saved, engine.narrow = engine.narrow, {}
    try:
        yield
    finally:
        engine.narrow = saved


def narrow_check(
    backend,
    decode: Callable[[list[int]], tuple[torch.Tensor, object]],
    references: tuple[torch.Tensor, list[torch.Tensor]],
    wide_threads: int | None,
) -> dict:
    """The report's narrow_* fields (none for an engine without narrow calls). `decode(sizes)`
    decodes the probe sequence in calls of those sizes from a fresh state, returning (logits,
    state); `references`: the full-width logits and keys/values it must reproduce."""
    engine = getattr(backend, "engine", None)
    if engine is None or not hasattr(engine, "narrow") or getattr(backend, "precision", "") != "int8":
        return {}
    counts = (torch.get_num_threads(), *(() if wide_threads is None else (wide_threads,)))
    proven, difference = [], ""
    for width in narrower_widths(engine.shape.width):
        problem = _difference_at(engine, decode, width, counts, references)
        if problem:
            difference = difference or problem
        else:
            proven.append(width)
    return {"narrow_widths": tuple(proven), "narrow_threads": counts, "narrow_difference": difference}


def _difference_at(engine, decode, width: int, counts: tuple[int, ...], references) -> str:
    """ "" if calls of `width` rows reproduce the references at every count, else the first difference."""
    reference, reference_kv = references
    n = len(reference)
    for count in counts:
        with torch_threads(count), full_width(engine):
            engine.narrow = {count: (width,)}
            logits, state = decode(sizes_within(width, n))
        differing, kv = compare_rows(reference, reference_kv, logits, state, n)
        if differing or kv:
            where = f"row {differing[0]}" if differing else "keys/values"
            return f"calls of {width} row(s) at {count} thread(s) DIFFERENT ({where})"
    return ""
