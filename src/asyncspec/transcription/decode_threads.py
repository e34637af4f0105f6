"""How many threads a transcriber's decoder takes: beside the producer, and alone."""

from __future__ import annotations

from asyncspec.errors import InputError
from asyncspec.models.threads import available_cores, torch_threads

# Alone, the decoder takes the wider count only if its call is this much faster there: a call is
# bound by memory, and under OMP_WAIT_POLICY=PASSIVE two threads waking for every small operator
# made a whisper-base call 45 ms against 26 ms on one (2-core Xeon, 2026-12-04).
FASTER_BY = 0.95


def beside_threads(threads: int | None) -> int:
    """The decoder's threads while a producer drafts: `threads`, else every core but the producer's."""
    if threads is not None and threads < 1:
        raise InputError(f"threads must be at least 1, got {threads}")
    return threads or max(available_cores() - 1, 1)


def decode_threads(
    target, threads: int | None, solo_threads: int | None, stacked_blocks: int | None = None
) -> tuple[int, int]:
    """(threads beside a producer, threads alone). Alone the decoder takes more threads only if the
    self-test finds every row and KV position bitwise equal at both counts: As²d switches between
    them mid-recording, and target-only (at the solo count) is the reference it must equal. With
    `stacked_blocks`, the self-test's batch check runs too, at both counts (fallback draws). Unless
    `solo_threads` is given, the wider count must also be measured faster (`call_seconds`)."""
    from asyncspec.models.selftest import invariance

    if solo_threads is not None and solo_threads < 1:
        raise InputError(f"threads must be at least 1, got {solo_threads}")
    beside, solo = beside_threads(threads), solo_threads or available_cores()
    if solo == beside and stacked_blocks is None:
        return beside, solo
    with torch_threads(beside):
        report = invariance(target, wide_threads=solo if solo != beside else None, stacked_blocks=stacked_blocks)
    if not report.may_use(solo):
        return beside, beside
    if solo_threads is None and solo != beside and not faster_at(target, solo, beside):
        return beside, beside
    return beside, solo


def faster_at(target, wide: int, narrow: int) -> bool:
    """Whether one decoding call takes under FASTER_BY of its `narrow`-thread time at `wide` threads."""
    if getattr(target, "engine", None) is None:
        return True  # the transformers engine: no fixed call to time
    seconds = measured_call_seconds(target, (narrow, wide))
    return seconds[wide] < FASTER_BY * seconds[narrow]


def measured_call_seconds(target, counts: tuple[int, ...]) -> dict[int, float]:
    """`call_seconds` at each count."""
    return {count: call_seconds(target, count) for count in counts}


def call_seconds(target, threads: int) -> float:
    """One decoding call (one block of the engine's width) at `threads`, on the self-test's probe
    prompt: measured once per machine, model and OpenMP settings (draw_plan.kept_call_costs)."""
    from asyncspec.decoding.draw_plan import kept_call_costs
    from asyncspec.models.selftest import probe_state

    def scratch():
        state = probe_state(target)
        return state.cache, state.length

    with torch_threads(threads):
        return kept_call_costs(target, scratch, 1)[1]
