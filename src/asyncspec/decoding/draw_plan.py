"""How many candidate rows each fallback draw verifies in the next call, and how wide that call is.

Every unfinished draw feeds its last token (its root row). Rows left over in the call carry
candidates: the j-th candidate of a draw is worth its chance of being reached and accepted,
alpha ** j, alpha being that draw's acceptance so far. A wider call costs more, but not in
proportion (one call's weights pass serves all its rows: whisper-base int8, one thread, AVX-512
without bf16: 24 ms for 8 rows, 31 for 16, 44 for 32, 73 for 64), so the plan takes the call
size, among those the self-test proved exact, that commits the most expected tokens per second.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from asyncspec.models.base import call_sizes
from asyncspec.models.call_stacks import cut_into_stacks, stack_sizes
from asyncspec.models.fixed_shape import RowSlot, StaticKV
from asyncspec.models.threads import openmp_settings

_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> {(threads, blocks): seconds}
# bumped when what a kept timing measures changes (2: integer cross-attention sums; 3: warmed up, best of
# TIMED_CALLS: best of two cold calls kept a two-thread call at 19.9 ms against 17.8 on one, where
# warmed up it takes 12.1 against 16.5, and target-only then decoded on one thread: 117 s cold
# against 86 s warm on the large long-form set, 2-core Zen 4 capped to VNNI; 4: int8 Whisper's calls
# through the TorchScript graph, a third cheaper: models/scripted_step.py)
COST_REVISION = 4
WARM_UP_CALLS = 2  # the first calls at a thread count wake its threads
TIMED_CALLS = 5


@dataclass(frozen=True)
class Plan:
    candidates: list[int]  # per draw, how many of its proposals to verify
    blocks: int  # the call's blocks of `width` rows
    expected_tokens: float


def plan_rows(
    proposals: Sequence[int], acceptance: Sequence[float], width: int, costs: dict[int, float], most_blocks: int
) -> Plan:
    """proposals[i]: candidates draw i has; acceptance[i]: its alpha; costs: seconds of one call of
    n blocks, for n in 1 and the proven stack sizes. Every draw gets its root row."""
    draws = len(proposals)
    gains = sorted(
        ((acceptance[i] ** j, i) for i, count in enumerate(proposals) for j in range(1, count + 1)), reverse=True
    )
    best: tuple[float, int, int] | None = None  # (tokens per second, blocks, candidates taken)
    for blocks in range(-(-draws // width), max(most_blocks, -(-draws // width)) + 1):
        taken = min(blocks * width - draws, len(gains))
        if taken < 0 or (blocks > -(-draws // width) and draws + taken <= (blocks - 1) * width):
            continue  # a block with nothing in it
        value = draws + sum(gain for gain, _ in gains[:taken])
        cost = sum(costs[size] for size in cut_into_stacks(blocks, most_blocks))
        if best is None or value / cost > best[0]:
            best = (value / cost, blocks, taken)
    assert best is not None
    counts = [0] * draws
    for _, draw in gains[: best[2]]:
        counts[draw] += 1
    return Plan(counts, best[1], draws + sum(gain for gain, _ in gains[: best[2]]))


@torch.inference_mode()
def call_costs(engine, cache, position: int, most_blocks: int) -> dict[int, float]:
    """Seconds of one call of n blocks, for n = 1 and every stack size up to `most_blocks`, at this
    process's thread count: measured once per engine and thread count (warmed up, best of
    TIMED_CALLS), on rows written into `cache` past `position` (a scratch cache: nothing of it is
    read afterwards)."""
    threads = torch.get_num_threads()
    known = _COSTS.setdefault(engine, {})
    for blocks in [1, *stack_sizes(most_blocks)]:
        if (threads, blocks) in known:
            continue
        rows = blocks * engine.shape.width
        slots = [RowSlot(cache, position + min(row, engine.shape.width - 1)) for row in range(rows)]
        tokens = [engine.pad_id] * rows
        known[(threads, blocks)] = best_seconds(partial(engine.run_rows, slots, tokens, blocks))
    return {blocks: known[(threads, blocks)] for blocks in [1, *stack_sizes(most_blocks)]}


def kept_call_costs(target, scratch: Callable[[], tuple[StaticKV, int]], most_blocks: int) -> dict[int, float]:
    """`call_costs` at this thread count, kept in the per-machine cache (model, weights, call shape,
    OpenMP settings), as the self-test's verdict is: timed in every process, it cost a transcriber
    0.4 s at its first fallback (whisper-base int8, 2-core EPYC capped to VNNI). `scratch()`: the
    cache and position to time on, made only when nothing is kept."""
    blocks = [1, *stack_sizes(most_blocks)]
    return _kept("call_costs", target, {"blocks": blocks}, lambda: call_costs(target.engine, *scratch(), most_blocks))


def kept_size_costs(target, scratch: Callable[[], tuple[StaticKV, int]]) -> dict[int, float]:
    """Seconds of one decoding call at each size the engine may run at this thread count (its
    proven narrow sizes and its full width: `models.base.call_sizes`), kept as `kept_call_costs`'."""
    sizes = call_sizes(target)
    return _kept("size_costs", target, {"sizes": list(sizes)}, lambda: size_costs(target.engine, *scratch(), sizes))


@torch.inference_mode()
def size_costs(engine, cache, position: int, sizes: Sequence[int]) -> dict[int, float]:
    """Seconds of one decoding call of each size in `sizes` (rows), warmed up, best of TIMED_CALLS,
    written into `cache` past `position` (a scratch cache: nothing of it is read afterwards)."""
    return {size: best_seconds(partial(engine.run, cache, position, [engine.pad_id] * size)) for size in sizes}


def best_seconds(call: Callable[[], object]) -> float:
    """The fastest of TIMED_CALLS calls, after WARM_UP_CALLS untimed ones."""
    for _ in range(WARM_UP_CALLS):
        call()
    timings = []
    for _ in range(TIMED_CALLS):
        started = time.perf_counter()
        call()
        timings.append(time.perf_counter() - started)
    return min(timings)


def _kept(kind: str, target, asked: dict, measure: Callable[[], dict[int, float]]) -> dict[int, float]:
    """A timing per call size or stack, from the per-machine cache or measured now and kept."""
    from asyncspec.models.cache_entries import entry_path, keep_first
    from asyncspec.models.selftest import machine_key

    asked = asked | {"openmp": openmp_settings(), "threads": torch.get_num_threads()}
    path = entry_path(kind, machine_key(target) | asked | {"revision": COST_REVISION})
    try:
        return {int(count): seconds for count, seconds in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        measured = {str(count): seconds for count, seconds in measure().items()}
        return {int(count): seconds for count, seconds in keep_first(path, measured).items()}
