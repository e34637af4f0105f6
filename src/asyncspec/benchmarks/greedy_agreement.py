"""Greedy agreement of one precision's token sequences with a reference precision's, per prompt.

For each prompt: the length of the common prefix of the two greedy continuations, and whether they
are identical. A sequence that is a strict prefix of the other (one ended at end-of-sequence where the
other went on) diverges at the shorter one's length.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncspec.verify import common_prefix


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where `a` and `b` differ (None: identical)."""
    if list(a) == list(b):
        return None
    return common_prefix(a, b)


def agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> dict:
    """Per-prompt common prefixes and divergences of `other` against `reference`, and their summary:
    the fraction of prompts identical, the mean common prefix (all prompts), the mean first-divergence
    position (diverging prompts only) and the mean fraction of the reference kept before divergence."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference sequences against {len(other)}")
    prefixes = [common_prefix(r, o) for r, o in zip(reference, other, strict=True)]
    divergences = [first_divergence(r, o) for r, o in zip(reference, other, strict=True)]
    diverged = [d for d in divergences if d is not None]
    kept = [p / len(r) if r else 1.0 for p, r in zip(prefixes, reference, strict=True)]
    count = len(reference)
    return {
        "prompts": count,
        "identical": count - len(diverged),
        "identical_fraction": (count - len(diverged)) / count if count else None,
        "mean_common_prefix": sum(prefixes) / count if count else None,
        "mean_first_divergence": sum(diverged) / len(diverged) if diverged else None,
        "mean_reference_fraction_kept": sum(kept) / count if count else None,
        "common_prefix": prefixes,
        "first_divergence": divergences,
    }
