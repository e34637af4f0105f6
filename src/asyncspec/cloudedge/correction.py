"""Certified progressive correction at the edge (seed 002 §IV-B2/B3).

After a sampled rejection the edge must draw one token from the residual r = [p - q]+ / Z while
holding only q (its draft state Q_i) and whatever the cloud sends of p. A `CorrectionSession`
is that decision as a small state machine: it is fed what the cloud returned and answers either
`Decided(token, ...)` or `Ask(kind, start, stop)` for the next, richer query:

  exact recovery with the proposals (and uniforms) the rejecting verdict carried, when it did: no
    round trip, nothing charged (the cloud settles the rejection itself where it can decide this
    round from q(rejected) alone; the edge finishes the round otherwise)
  -> top-K support (K from the schedule, growing monotonically over the same ordered support)
    -> bounded draw from a_v / Z_S when Z_S > 0 and eps_bar_K fits the request's remaining budget
  -> exact recovery: N proposals v ~ p, accept v with [1 - q(v)/p(v)]+ (first accepted is exact)
  -> the full distribution p (exact residual).

A bounded draw charges eps_bar_K to the request's `FidelityBudget`; the sum never exceeds
eps_req, so eps_req = 0 makes every correction exact.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from asyncspec.verify import exact_recovery, residual, tv_certificate


@dataclass(frozen=True)
class CorrectionPolicy:
    k_schedule: tuple[int, ...] = (16, 64, 256, 1024)  # top-K sizes, first one comes with the verdict
    proposals: int = 32  # exact-recovery proposals per query
    proposal_rounds: int = 1  # rounds of proposals (the verdict's included) before the full distribution
    full_only: bool = False  # ablation "no top-K": the full distribution on every rejection
    verdict_proposals: int = 32  # proposals a rejecting verdict carries (0: the edge queries for them)

    @property
    def first_k(self) -> int:
        return 0 if self.full_only or not self.k_schedule else self.k_schedule[0]

    @property
    def first_proposals(self) -> int:
        """Proposals to ask the cloud to attach to a rejecting verdict (round 0 of exact recovery)."""
        if self.full_only or self.proposals <= 0 or self.proposal_rounds <= 0:
            return 0
        return self.verdict_proposals


@dataclass
class FidelityBudget:
    """Per-request TV budget: bounded corrections spend it, never beyond eps_req."""

    eps_req: float = 0.0
    spent: float = 0.0

    def fits(self, eps: float) -> bool:
        return eps == 0.0 or self.spent + eps <= self.eps_req

    def charge(self, eps: float) -> None:
        if not self.fits(eps):
            raise ValueError(f"charging {eps} would exceed the budget {self.eps_req} (spent {self.spent})")
        self.spent += eps

    @property
    def remaining(self) -> float:
        return max(self.eps_req - self.spent, 0.0)


@dataclass(frozen=True)
class Decided:
    token: int
    # "topk" (bounded, eps charged; exact when eps == 0), "exact" (proposals, decided at the edge),
    # "full"; settled by the cloud inside the verdict: "cloud" (exact recovery), "residual" (full uplink)
    mode: str
    k: int = 0  # support size used by a top-K draw
    eps: float = 0.0  # charged certificate
    p: float | None = None  # the target's p(token), from what the cloud sent (logprobs.py)


@dataclass(frozen=True)
class Ask:
    kind: str  # "topk" | "proposals" | "full"
    start: int = 0  # topk: first new support entry; proposals: round
    stop: int = 0  # topk: support size wanted; proposals: how many


MODES = ("cloud", "residual", "exact", "topk", "full")


@dataclass
class CorrectionCounts:
    """Per request: how rejections were settled and how many round trips each mode took."""

    topk: Counter = field(default_factory=Counter)  # K -> bounded draws at that support size
    exact: int = 0  # exact recovery decided at the edge (verdict's or queried proposals)
    full: int = 0
    cloud: int = 0  # exact recovery the cloud decided inside the verdict
    residual: int = 0  # full-uplink baselines: the cloud drew from [p - q]+ inside the verdict
    queries: int = 0  # correction round trips beyond the verdict
    rounds: Counter = field(default_factory=Counter)  # mode -> correction round trips it took in all
    in_verdict: int = 0  # corrections settled with no round trip beyond the verdict
    eps_charged: float = 0.0

    def observe(self, decided: Decided, rounds: int = 0) -> None:
        if decided.mode == "topk":
            self.topk[decided.k] += 1
        elif decided.mode in ("exact", "full", "cloud", "residual"):
            setattr(self, decided.mode, getattr(self, decided.mode) + 1)
        else:
            raise ValueError(f"unknown correction mode {decided.mode!r}")
        self.rounds[decided.mode] += rounds
        self.in_verdict += rounds == 0
        self.eps_charged += decided.eps

    def as_dict(self) -> dict:
        return {
            "topk": {str(k): n for k, n in sorted(self.topk.items())},
            "exact": self.exact,
            "full": self.full,
            "cloud": self.cloud,
            "residual": self.residual,
            "queries": self.queries,
            "rounds": {mode: self.rounds[mode] for mode in MODES if self.rounds[mode]},
            "in_verdict": self.in_verdict,
            "eps_charged": self.eps_charged,
        }


class CorrectionSession:
    """One rejection's correction. `q` is the draft distribution at the rejected position."""

    def __init__(
        self,
        q: torch.Tensor,  # [V] float32
        budget: FidelityBudget,
        policy: CorrectionPolicy,
        generator: torch.Generator,
    ):
        self.q = q
        self.budget = budget
        self.policy = policy
        self.generator = generator
        self.ids: list[int] = []
        self.p = torch.empty(0)
        self.round = 0

    def first(
        self,
        ids: list[int],
        p: torch.Tensor,
        tail: float,
        proposals: tuple[list[int], torch.Tensor, torch.Tensor] | None = None,
    ) -> Decided | Ask:
        """The verdict's own top-K (possibly none, under the full-only ablation), after the exact-recovery
        round it carried, if any: (proposal ids, their p, the cloud's uniforms). That round goes first:
        it is exact and free, and the cloud's uniforms must be the ones used, since whether the cloud
        settled the rejection itself depended on them."""
        if proposals is not None and proposals[0]:
            self.round += 1
            token = exact_recovery(proposals[0], proposals[1], self.q[proposals[0]], proposals[2].double())
            if token is not None:
                return Decided(token, "exact", p=_p_of(token, proposals[0], proposals[1]))
        if self.policy.full_only:
            return Ask("full")
        if not ids:
            return self._exact_or_full()
        return self.add_support(ids, p, tail)

    def add_support(self, ids: list[int], p: torch.Tensor, tail: float) -> Decided | Ask:
        self.ids += ids
        self.p = torch.cat([self.p, p.float()])
        support_q = self.q[self.ids]
        z_support, eps = tv_certificate(self.p, support_q, tail)
        if z_support > 0 and self.budget.fits(eps):
            self.budget.charge(eps)
            excess = torch.clamp(self.p.double() - support_q.double(), min=0.0)
            index = int(torch.multinomial(excess / excess.sum(), 1, generator=self.generator))
            return Decided(self.ids[index], "topk", len(self.ids), eps, float(self.p[index]))
        return self._after_support(tail)

    def _after_support(self, tail: float) -> Ask:
        """Grow K while a larger support could still fit the budget; else go exact."""
        larger = [k for k in self.policy.k_schedule if k > len(self.ids) and k < self.q.numel()]
        if larger and self.budget.remaining > 0 and tail > 0:
            return Ask("topk", len(self.ids), larger[0])
        return self._exact_or_full()

    def _exact_or_full(self) -> Ask:
        if self.policy.proposals > 0 and self.round < self.policy.proposal_rounds:
            return Ask("proposals", self.round, self.policy.proposals)
        return Ask("full")

    def add_proposals(self, ids: list[int], p: torch.Tensor) -> Decided | Ask:
        self.round += 1
        uniforms = torch.rand(len(ids), generator=self.generator, dtype=torch.float64)
        token = exact_recovery(ids, p, self.q[ids], uniforms)
        if token is not None:
            return Decided(token, "exact", p=_p_of(token, ids, p))
        return self._exact_or_full()

    def add_full(self, p: torch.Tensor) -> Decided:
        token = int(torch.multinomial(residual(p.double(), self.q.double()), 1, generator=self.generator))
        return Decided(token, "full", p=float(p[token]))


def _p_of(token: int, ids: list[int], p: torch.Tensor) -> float:
    return float(p[ids.index(token)])
