"""The methods the cloud–edge benchmark compares, as edge configurations on the same services, link
and models (seed 002 §V-A4 baselines and §V-C Table II ablations). Every method here keeps the
target's output exact: greedy runs reproduce target-only token for token, sampled runs keep the
target distribution (eps_req = 0).

  asymspec                  compact uplink (id + q(id) per candidate), certified top-K -> exact
                            recovery -> full correction on the downlink, confirmed-prefix pipeline
                            across requests (the edge drafts another ready request while one waits),
                            cloud re-batches arrived blocks.
  standard                  Standard Spec: stop-and-wait (one open block at a time, the edge idles
                            during verification) and the symmetric exchange of seed 002 Table I:
                            every candidate position's full draft distribution goes up (4·|V| B),
                            the cloud settles rejections itself.
  runahead                  PipeInfer-style: the standard exchange, no cross-request pipeline, but
                            while a block waits the edge drafts up to 2 further blocks of the same
                            request from its unconfirmed prefix (presuming full acceptance and its own
                            guess of the bonus token); a verdict that disagrees invalidates them.
  cosine                    CoSine-style (see COSINE_NOTE): decoupled drafting and verification with
                            cross-request pipelining and cloud batching, the standard exchange, and
                            adaptive speculation length (a block stops after a candidate with drafter
                            probability < 0.5).
  no-asym-topk              ablation "no asymmetric correction / top-K": AsymSpec with the symmetric
                            full-distribution uplink (the cloud corrects itself; no top-K).
  no-topk                   ablation "no top-K": compact uplink, the full target distribution on the
                            downlink at every sampled rejection.
  no-pipeline               ablation "no pipeline": AsymSpec's protocol, stop-and-wait scheduling.
  no-pipeline-runahead      ablation "no pipeline + runahead": AsymSpec's protocol, stop-and-wait
                            across requests, same-request runahead (depth 2) instead of the pipeline.
  asymspec-adaptive         ablation "+ adaptive block length" (an addition to the paper): AsymSpec with
                            each request's block length chosen from its running acceptance
                            (EdgePolicy.gamma_for).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.errors import InputError

COSINE_MIN_CONFIDENCE = 0.5
RUNAHEAD_DEPTH = 2

COSINE_NOTE = (
    "CoSine (Gao et al., INFOCOM 2026; arXiv 2503.10325) routes requests to specialised drafters, fuses "
    "several drafters' tokens by confidence, pipelines drafting and verification across nodes, batches "
    "requests selectively at the verifier and adapts the speculation length. Implemented here: decoupled "
    "drafting/verification pipelined across requests, cross-request batching at the cloud (FIFO, up to "
    "max_batch blocks per forward), adaptive speculation length (stop a block after a candidate whose "
    "drafter probability is below 0.5), and the standard full-distribution verification exchange. Not "
    "implemented: multiple drafters, request routing and confidence-based token fusion (one 0.5B drafter), "
    "and CoSine's selective batch grouping and throughput-balancing controller."
)

BASELINES = ("standard", "runahead", "cosine")
ABLATIONS = ("no-asym-topk", "no-topk", "no-pipeline", "no-pipeline-runahead", "asymspec-adaptive")
METHODS = ("asymspec", *BASELINES, *ABLATIONS)
# Seed 002 Table II row labels.
TABLE_II_LABELS = {
    "asymspec": "Full",
    "no-asym-topk": "No asymmetric correction / top-K",
    "no-topk": "No top-K",
    "no-pipeline": "No pipeline",
    "no-pipeline-runahead": "No pipeline + runahead",
    "asymspec-adaptive": "+ adaptive block length",
}


def method_policy(name: str, base: EdgePolicy | None = None) -> EdgePolicy:
    """The edge policy of a named method; `base` carries the shared settings (block size, K schedule...)."""
    base = base or EdgePolicy()
    full_only = replace(base.correction, full_only=True)
    presets: dict[str, dict[str, Any]] = {
        "asymspec": {},
        "standard": dict(uplink="full", pipeline=False),
        "runahead": dict(uplink="full", pipeline=False, runahead=True, runahead_depth=RUNAHEAD_DEPTH),
        "cosine": dict(uplink="full", pipeline=True, draft_min_confidence=COSINE_MIN_CONFIDENCE),
        "no-asym-topk": dict(uplink="full"),
        "no-topk": dict(correction=full_only),
        "no-pipeline": dict(pipeline=False),
        "no-pipeline-runahead": dict(pipeline=False, runahead=True, runahead_depth=RUNAHEAD_DEPTH),
        "asymspec-adaptive": dict(adaptive_gamma=True),
    }
    if name not in presets:
        raise InputError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    settings: dict[str, Any] = dict(
        uplink="compact", pipeline=True, runahead=False, draft_min_confidence=None, adaptive_gamma=False
    )
    return replace(base, **{**settings, **presets[name]})


def parse_methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    if text.strip() == "all":
        return list(METHODS)
    for name in names:
        method_policy(name)
    if not names:
        raise InputError("give at least one method")
    return names
