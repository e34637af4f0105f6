"""Stage accounting of one decode (seed 000 App. D.2.7): producer service D, verifier service V,
their overlap O and the residual H, with the identity T = D + V - O + H."""

from __future__ import annotations

from dataclasses import asdict, dataclass

Interval = tuple[float, float]


def merge(intervals: list[Interval]) -> list[Interval]:
    """Union of intervals as sorted, disjoint intervals."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def clip(intervals: list[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]


def length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def intersection(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass(frozen=True)
class StageAccounting:
    total_s: float  # T
    producer_s: float  # D
    verifier_s: float  # V
    overlap_s: float  # O
    residual_s: float  # H

    def as_dict(self) -> dict[str, float]:
        return {key: round(value, 6) for key, value in asdict(self).items()}


def account(producer: list[Interval], verifier: list[Interval], start: float, end: float) -> StageAccounting:
    """D, V, O, H over [start, end]; T = D + V - O + H holds by construction (inclusion-exclusion)."""
    p = merge(clip(producer, start, end))
    v = merge(clip(verifier, start, end))
    d, vv, o = length(p), length(v), length(intersection(p, v))
    total = end - start
    return StageAccounting(total, d, vv, o, total - length(merge(p + v)))
