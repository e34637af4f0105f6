"""The edge's figures. Per-request figures live in each request's `RequestStats` only; the edge's
totals are derived from them (finished requests folded into `RequestTotals`), so nothing is counted
twice. `EdgeEvents` keeps what belongs to no request: the link, the cloud, replies about requests
the edge no longer knows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

from asyncspec.cloudedge.requests import RequestStats


@dataclass
class EdgeEvents:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    blocks_sent: int = 0
    cloud_lost: int = 0  # silence beyond dead_after_s with work outstanding
    cloud_restarts: int = 0  # a Pong from a new cloud instance
    open_block_violations: int = 0  # attempts to open a second block of one request (never expected)
    request_errors: int = 0  # requests failed by an error while serving them (the edge goes on)
    cancelled: int = 0  # requests their client abandoned (an HTTP client that disconnected)
    invalid_replies: int = 0  # cloud replies that failed their checks (their request fails)
    unattributed_stale_replies: int = 0  # verdicts / corrections about requests no longer known
    unattributed_nacks: Counter = field(default_factory=Counter)


@dataclass
class RequestTotals:
    """Sums over requests' stats (maximum for max_open_blocks)."""

    resyncs: int = 0
    resubmitted_blocks: int = 0
    stale_replies: int = 0
    nacks: Counter = field(default_factory=Counter)
    invalidated_blocks: int = 0  # runahead blocks a verdict invalidated (runahead only)
    invalidated_tokens: int = 0
    promoted_blocks: int = 0  # runahead blocks whose presumption held
    max_open_blocks: int = 0  # most blocks of one request open at once

    def add(self, stats: RequestStats) -> None:
        self.resyncs += stats.resyncs
        self.resubmitted_blocks += stats.resubmits
        self.stale_replies += stats.stale_replies
        self.nacks.update(stats.nacks)
        self.invalidated_blocks += stats.invalidated_blocks
        self.invalidated_tokens += stats.invalidated_tokens
        self.promoted_blocks += stats.promoted_blocks
        self.max_open_blocks = max(self.max_open_blocks, stats.max_open_blocks)

    def copy(self) -> RequestTotals:
        out = RequestTotals(**{f.name: getattr(self, f.name) for f in fields(self)})
        out.nacks = Counter(self.nacks)
        return out


@dataclass(frozen=True)
class EdgeCounters:
    """A snapshot: the edge's events plus the totals over every request it has served."""

    events: EdgeEvents
    totals: RequestTotals

    def __getattr__(self, name: str):
        if name in ("events", "totals"):  # not yet set (copying): no recursion
            raise AttributeError(name)
        if name in ("stale_replies", "nacks"):
            return self._combined(name)
        source = self.totals if hasattr(self.totals, name) else self.events
        return getattr(source, name)

    def _combined(self, name: str):
        if name == "nacks":
            return self.totals.nacks + self.events.unattributed_nacks
        return self.totals.stale_replies + self.events.unattributed_stale_replies

    def as_dict(self) -> dict:
        out = {
            f.name: getattr(self.events, f.name) for f in fields(self.events) if not f.name.startswith("unattributed")
        }
        out |= {f.name: getattr(self.totals, f.name) for f in fields(self.totals)}
        out["stale_replies"] = self._combined("stale_replies")
        out["nacks"] = dict(self._combined("nacks"))
        return out


def snapshot(events: EdgeEvents, finished: RequestTotals, active: list[RequestStats]) -> EdgeCounters:
    totals = finished.copy()
    for stats in active:
        totals.add(stats)
    return EdgeCounters(events, totals)
