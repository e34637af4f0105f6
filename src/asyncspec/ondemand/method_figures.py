"""The decoding figures of one `listen` answer, summed over its windows (kept apart from the engine,
which assembles the answer around them)."""

from __future__ import annotations

from typing import Any

from asyncspec.decoding.result import DecodeResult


def method_figures(results: list[DecodeResult]) -> dict[str, Any]:
    """A response's `method_stats`: target calls, drafts and their acceptance, K=1 share and
    coverage, summed over the request's windows; As²d's publications and producer failures."""
    stats = [r.stats for r in results]
    widths = [w for s in stats for w in s.call_widths]
    figures = {
        "target_calls": sum(s.target_calls for s in stats),
        "drafted": sum(s.drafted for s in stats),
        "accepted": sum(s.accepted for s in stats),
        "k1_share": round(widths.count(1) / len(widths), 3) if widths else 0.0,
    }
    n_tokens = sum(len(r.tokens) for r in results)
    figures["coverage"] = round(figures["accepted"] / n_tokens, 3) if n_tokens else 0.0
    published = [s.as2d.published for s in stats if s.as2d is not None]
    if published:
        figures["published"] = sum(published)
        figures["producer_failures"] = sum(bool(s.as2d.producer_failure) for s in stats if s.as2d is not None)
    return figures
