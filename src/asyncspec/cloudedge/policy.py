"""The edge's method switches: one dataclass, so baselines and ablations are configurations.

AsymSpec (default): compact uplink (token id + q(token)), certified progressive correction,
confirmed-prefix pipeline across requests. Ablations / baselines (seed 002 §V):
  - `uplink="full"`: standard speculative decoding's uplink — every candidate's full draft
    distribution goes up and the cloud settles the rejection itself (4·|V| B per position);
  - `correction=CorrectionPolicy(full_only=True)`: "no top-K" — the full target distribution on
    every rejection;
  - `pipeline=False`: "no pipeline" — stop-and-wait, at most one open block across all requests;
  - `runahead=True`: PipeInfer-style drafting from an unconfirmed prefix. It breaks the
    N_open <= 1 invariant on purpose; not implemented here (the benchmark issue adds it).
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
        if self.runahead:
            raise NotImplementedError(
                "runahead (drafting from an unconfirmed prefix) is a baseline to add; see policy.py"
            )
