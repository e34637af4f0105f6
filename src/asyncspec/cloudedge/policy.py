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
    (adaptive speculation length; the CoSine-style baseline uses it).
The named presets (asymspec, standard, runahead, cosine, ablations) are in `cloudedge/methods.py`.
"""

from __future__ import annotations

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

    @property
    def max_open_per_request(self) -> int:
        return 1 + self.runahead_depth if self.runahead else 1
