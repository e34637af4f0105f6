"""How many threads a transcriber's decoder takes: beside the producer, and alone."""

from __future__ import annotations

from asyncspec.errors import InputError
from asyncspec.models.threads import available_cores, torch_threads


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
    `stacked_blocks`, the self-test's batch check runs too, at both counts (fallback draws)."""
    from asyncspec.models.selftest import invariance

    if solo_threads is not None and solo_threads < 1:
        raise InputError(f"threads must be at least 1, got {solo_threads}")
    beside, solo = beside_threads(threads), solo_threads or available_cores()
    if solo == beside and stacked_blocks is None:
        return beside, solo
    with torch_threads(beside):
        report = invariance(target, wide_threads=solo if solo != beside else None, stacked_blocks=stacked_blocks)
    return beside, solo if report.may_use(solo) else beside
