"""Trace replay (seed 000 §4.3, App. D.3, D.4.3): re-price a window's saved trajectory under a
cost model, for target-only and As²d at any budget, and for sd/specasr at their recorded budget.

The As²d replay runs the very round of `decoding/as2d.py` (`as2d_rounds`: the same buffer,
alignment and confidence rule) through a driver whose time comes from a pricer and whose target
decisions come from the reference tokens (As²d is exact, so the target's greedy token at every
position is known). Causality is enforced, not assumed: a publication enters the buffer only once
the pricer says it was delivered, and one published after the decision that would read it raises
`CausalityError`.

Pricers: `ProfilePricer` charges a measured `CostProfile`; `NativePricer` charges a native run's
own stage durations, so replaying that run must reproduce its operations and its D/V/O/H.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from asyncspec.decoding.as2d import as2d_rounds
from asyncspec.decoding.result import DecodeStats, commit_token
from asyncspec.ondevice.accounting import StageAccounting, account
from asyncspec.ondevice.buffer import CandidateBuffer, PublishedBatch
from asyncspec.ondevice.call_plan import VerifyPlan
from asyncspec.profiling.costs import CostProfile
from asyncspec.profiling.trajectory import EOS, NativeRun, Publication, WindowTrajectory
from asyncspec.verify import Verdict

CAUSALITY_TOLERANCE_S = 1e-6


class CausalityError(RuntimeError):
    """A candidate would be used before its publication."""


class ReplayMismatch(RuntimeError):
    """Replay took a different operation than the native run it is checked against."""


class Pricer(Protocol):
    def lead(self) -> float: ...  # from decoding start to the first round

    def align(self, round_index: int) -> float: ...

    def handoff(self, round_index: int) -> float: ...  # between reading candidates and the call

    def verify(self, round_index: int, width: int, offset: int, concurrent: bool) -> float: ...

    def gap(self, round_index: int, last: bool) -> float: ...  # after the call: commit, rollback, loop

    def visible(self, publication: Publication, refresh: int, now: float) -> bool: ...


@dataclass
class ProfilePricer:
    profile: CostProfile
    target_only: bool = False

    def lead(self) -> float:
        return 0.0 if self.target_only else self.profile.lead_s

    def align(self, round_index: int) -> float:
        return self.profile.align_s

    def handoff(self, round_index: int) -> float:
        return 0.0  # inside gap_s: the profile measures everything outside align and verify there

    def verify(self, round_index: int, width: int, offset: int, concurrent: bool) -> float:
        return self.profile.verify_s(width, offset, concurrent)

    def gap(self, round_index: int, last: bool) -> float:
        return self.profile.target_gap_s if self.target_only else self.profile.gap_s

    def visible(self, publication: Publication, refresh: int, now: float) -> bool:
        return publication.published + self.profile.delivery_s <= now


@dataclass
class NativePricer:
    """The native run's own durations, round by round; widths must match or replay is wrong."""

    run: NativeRun

    def __post_init__(self) -> None:
        self.aligns = [e for e in self.run.events if e.stage == "align"]
        self.calls = [e for e in self.run.events if e.stage == "verify"]

    def lead(self) -> float:
        first = (self.aligns or self.calls)[0] if (self.aligns or self.calls) else None
        return first.start if first else self.run.decode_s

    def align(self, round_index: int) -> float:
        return self.aligns[round_index].duration if self.aligns else 0.0

    def handoff(self, round_index: int) -> float:
        return self.calls[round_index].start - self.aligns[round_index].end if self.aligns else 0.0

    def verify(self, round_index: int, width: int, offset: int, concurrent: bool) -> float:
        if round_index >= len(self.calls) or self.calls[round_index].meta.get("width") != width:
            native = self.calls[round_index].meta.get("width") if round_index < len(self.calls) else None
            raise ReplayMismatch(f"round {round_index}: replay verifies width {width}, the native run {native}")
        return self.calls[round_index].duration

    def gap(self, round_index: int, last: bool) -> float:
        end = self.calls[round_index].end
        following = self.run.decode_s if last else (self.aligns or self.calls)[round_index + 1].start
        return following - end

    def visible(self, publication: Publication, refresh: int, now: float) -> bool:
        return publication.drained_at_refresh <= refresh


@dataclass
class ReplayRun:
    method: str
    source: str | None
    budget: int | None
    n_tokens: int
    time_s: float
    widths: list[int] = field(default_factory=list)
    accepted: int = 0
    accounting: StageAccounting | None = None

    @property
    def tps(self) -> float:
        return self.n_tokens / self.time_s if self.time_s > 0 else 0.0


class _ReplayBuffer(CandidateBuffer):
    """The native buffer, fed from saved publications as the pricer says they arrive."""

    def __init__(self, publications: list[Publication], source: str, pricer: Pricer):
        super().__init__(request_id=0)
        self.pending = sorted(publications, key=lambda p: p.offset)
        self.publications = publications
        self.source, self.pricer = source, pricer

    def refresh_at(self, now: float) -> None:
        self.refreshes += 1
        while self.pending and self.pricer.visible(self.pending[0], self.refreshes, now):
            p = self.pending.pop(0)
            self.publish(PublishedBatch(0, self.source, p.offset, p.tokens, p.confidences, p.started, p.published))

    def producer_busy(self, now: float) -> bool:
        return any(p.started <= now < p.published for p in self.publications)

    def check_causality(self, decision_time: float) -> None:
        late = [b for b in self.batches if b.published > decision_time + CAUSALITY_TOLERANCE_S]
        if late:
            raise CausalityError(f"a batch published at {late[0].published:.6f} s read at {decision_time:.6f} s")


class _ReplayRounds:
    """As²d's rounds over a saved trajectory: the reference tokens decide (As²d is exact), the
    pricer gives each stage its time, and publications enter the buffer when the pricer says."""

    def __init__(self, trajectory: WindowTrajectory, buffer: _ReplayBuffer, budget: int, pricer: Pricer):
        self.trajectory, self.buffer, self.budget, self.pricer = trajectory, buffer, budget, pricer
        self.committed: list[int] = []
        self.now, self.round_index = pricer.lead(), 0
        self.verifier: list[tuple[float, float]] = []
        self.widths: list[int] = []
        self.accepted = 0

    def commit(self, token: int) -> bool:
        """The decoders' own commit rule over reference positions (EOS stands for the target's end)."""
        return commit_token(token, self.committed, frozenset({EOS}), self.trajectory.limit, DecodeStats())

    def room(self) -> int:
        return min(self.budget, self.trajectory.room(len(self.committed)))

    @contextmanager
    def aligning(self):
        started = self.now
        self.buffer.refresh_at(self.now)
        self.now += self.pricer.align(self.round_index)
        self.verifier.append((started, self.now))
        self.buffer.check_causality(self.now)
        yield

    def verify(self, root: int, candidates: list[int]) -> Verdict:
        self.now += self.pricer.handoff(self.round_index)
        called, width, offset = self.now, len(candidates) + 1, len(self.committed) - 1  # in the target's cache
        self.now += self.pricer.verify(self.round_index, width, offset, self.buffer.producer_busy(self.now))
        self.verifier.append((called, self.now))
        accepted = _accepted(candidates, self.trajectory, len(self.committed))
        self.widths.append(width)
        self.accepted += accepted
        return Verdict(accepted, self.trajectory.target_next(len(self.committed) + accepted))

    def round_done(self, last: bool) -> None:
        self.now += self.pricer.gap(self.round_index, last)
        self.round_index += 1


def replay_as2d(trajectory: WindowTrajectory, source: str, budget: int, pricer: Pricer) -> ReplayRun:
    """decode_as2d's rounds (`as2d_rounds`) re-priced; the replayed time and D/V/O/H accounting."""
    publications = trajectory.sources[source]
    buffer = _ReplayBuffer(publications, source, pricer)
    rounds = _ReplayRounds(trajectory, buffer, budget, pricer)
    plan = VerifyPlan(dict(trajectory.call_seconds)) if trajectory.call_seconds else None
    proposer = buffer.make_proposer(trajectory.call_sizes)
    as2d_rounds(rounds, proposer, trajectory.target_next(0), rounds.committed, plan)
    run = ReplayRun("as2d", source, budget, len(trajectory.tokens), rounds.now, rounds.widths, rounds.accepted)
    producer = [(p.started, p.published) for p in publications]
    run.accounting = account(producer, rounds.verifier, 0.0, rounds.now)
    return run


def replay_target_only(trajectory: WindowTrajectory, pricer: Pricer) -> ReplayRun:
    """One width-1 call per committed token (none after the last when the length limit ends it)."""
    run = ReplayRun("target", None, None, len(trajectory.tokens), 0.0)
    now = pricer.lead()
    calls = len(trajectory.tokens) - (trajectory.finish_reason == "length")
    verifier = []
    for i in range(calls):
        start = now
        now += pricer.verify(i, 1, i, False)
        verifier.append((start, now))
        run.widths.append(1)
        now += pricer.gap(i, i == calls - 1)
    run.time_s = now
    run.accounting = account([], verifier, 0.0, now)
    return run


def reprice_serial(trajectory: WindowTrajectory, key: str, profile: CostProfile) -> ReplayRun:
    """A native sd/specasr run's own operation sequence (draft stages, call widths) under the
    profile: their proposals depend on the committed prefix, so other budgets need native runs."""
    native = trajectory.native[key]
    run = ReplayRun(native.method, None, native.budget, native.n_tokens, 0.0)
    offset = 0
    for event in native.events:
        if event.stage == "draft":
            run.time_s += profile.drafter_call_s + profile.drafter_step_s * event.meta.get("drafter_calls", 0)
        elif event.stage == "verify":
            width = event.meta["width"]
            run.time_s += profile.verify_s(width, offset) + profile.gap_s
            run.widths.append(width)
            offset += width
    return run


def _accepted(candidates: list[int], trajectory: WindowTrajectory, position: int) -> int:
    """How many leading candidates equal the target's greedy tokens from `position` on."""
    accepted = 0
    while accepted < len(candidates) and candidates[accepted] == trajectory.target_next(position + accepted):
        accepted += 1
    return accepted
