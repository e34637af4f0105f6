"""The edge's method switches: one dataclass, so baselines and ablations are configurations.

AsymSpec (default): compact uplink (token id + q(token)), certified progressive correction,
confirmed-prefix pipeline across requests. Ablations / baselines (seed 002 §V):
  - `uplink="full"`: standard speculative decoding's uplink — every candidate's full draft
    distribution goes up and the cloud settles the rejection itself (4·|V| B per position);
  - `correction=CorrectionPolicy(full_only=True)`: "no top-K" — the full target distribution on
    every rejection;
  - `pipeline=False`: "no pipeline" — stop-and-wait, at most one open block across all requests;
  - `runahead=True`: PipeInfer-style drafting from an unconfirmed prefix: while a request's block
    waits, the edge drafts up to `runahead_depth` further blocks of the same request, presuming the
    earlier blocks fully accepted and their bonus token equal to the drafter's own guess; a verdict
    that disagrees invalidates them (counted). The only mode that breaks N_open <= 1, and only when set;
  - `draft_min_confidence`: stop a block early after a candidate the drafter is less sure of
    (adaptive speculation length; the CoSine-style baseline uses it);
  - `adaptive_gamma`: choose each request's block length from its running acceptance (`gamma_for`);
    off for `asymspec`, on for the ablation `asymspec-adaptive`.
The named presets (asymspec, standard, runahead, cosine, ablations) are in `cloudedge/methods.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from asyncspec.cloudedge.correction import CorrectionPolicy

UPLINKS = ("compact", "full")


@dataclass(frozen=True)
class EdgePolicy:
    block_size: int = 7  # candidates per block (gamma)
    correction: CorrectionPolicy = field(default_factory=CorrectionPolicy)
    uplink: str = "compact"
    pipeline: bool = True
    runahead: bool = False
    runahead_depth: int = 2  # blocks drafted ahead of a request's oldest open block (runahead only)
    draft_min_confidence: float | None = None  # adaptive block length: stop after a less likely candidate
    adaptive_gamma: bool = False  # block length per request from its running acceptance (gamma_for)
    gamma_min: int = 1
    gamma_max: int = 12
    acceptance_decay: float = 0.7  # weight of the past per block in the running acceptance
    max_active: int = 256  # requests drafting / verifying at once; later submissions wait in order
    max_waiting: int = 4096  # submissions waiting beyond that get an error (back-pressure)
    heartbeat_s: float = 0.5  # ping period
    dead_after_s: float = 3.0  # silence (with work outstanding) after which open blocks are resubmitted
    give_up_s: float = 60.0  # silence after which outstanding requests fail with an error
    max_resyncs: int = 50  # per request, before it fails instead of looping
    busy_retry_s: float = 0.05

    def __post_init__(self):
        if self.uplink not in UPLINKS:
            raise ValueError(f"uplink must be one of {UPLINKS}")
        if self.block_size < 0:
            raise ValueError("block_size must be >= 0")
        if self.runahead_depth < 1:
            raise ValueError("runahead_depth must be >= 1")
        if not 1 <= self.gamma_min <= self.gamma_max or not 0 <= self.acceptance_decay <= 1:
            raise ValueError("need 1 <= gamma_min <= gamma_max and 0 <= acceptance_decay <= 1")

    def gamma_for(self, acceptance: float) -> int:
        """Block length for a per-candidate acceptance rate a: the expected run of accepted candidates,
        a / (1 - a) (geometric), rounded up and clipped to [gamma_min, gamma_max]. Candidates beyond it
        are more likely wasted than accepted, and each costs drafting and a verification position."""
        a = min(max(acceptance, 0.0), 0.99)
        return max(self.gamma_min, min(self.gamma_max, math.ceil(a / (1 - a) - 1e-9)))

    @property
    def max_open_per_request(self) -> int:
        return 1 + self.runahead_depth if self.runahead else 1
