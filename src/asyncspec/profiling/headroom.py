"""Selection headroom (seed 000 App. D.4.3, Tables 2/4): the deployed fixed configuration's pooled
replay throughput on test windows as a share of the per-window hindsight oracle's."""

from __future__ import annotations

from typing import Any

from asyncspec.profiling.costs import CostProfile
from asyncspec.profiling.selection import BUDGETS, Catalog, Entry, oracle, rank, replay_catalog
from asyncspec.profiling.trajectory import WindowTrajectory


def headroom(
    trajectories: list[WindowTrajectory], profile: CostProfile, producers: list[str], deployed: Entry
) -> dict[str, Any]:
    budgets = [b for b in BUDGETS if b + 1 <= max(profile.widths)]
    catalog = replay_catalog(trajectories, profile, producers, budgets)
    report = _figures(catalog, deployed)
    report.update(
        catalog={"producers": producers, "budgets": [budgets[0], budgets[-1]], "fallbacks": catalog.fallbacks},
        deployed={"producer": deployed.producer, "budget": deployed.budget},
        datasets={
            dataset: _figures(_subset(catalog, dataset), deployed)
            for dataset in sorted({t.dataset for t in trajectories})
        },
    )
    return report


def _figures(catalog: Catalog, deployed: Entry) -> dict[str, Any]:
    oracle_tps, best = oracle(catalog)
    deployed_tps = catalog.pooled_tps(catalog.seconds[deployed])
    (fixed, fixed_tps), *_ = rank(catalog)
    return {
        "windows": len(catalog.trajectories),
        "pooled_tps": round(oracle_tps, 3),
        "deployed_pooled_tps": round(deployed_tps, 3),
        "deployed_ratio": round(deployed_tps / oracle_tps, 4) if oracle_tps else None,
        "gap_pct": round(100 * (1 - deployed_tps / oracle_tps), 3) if oracle_tps else None,
        "target_pooled_tps": round(catalog.pooled_tps(catalog.target_seconds), 3),
        "best_fixed_in_hindsight": {
            "producer": fixed.producer,
            "budget": fixed.budget,
            "pooled_tps": round(fixed_tps, 3),
        },
        "per_window": [
            {
                "window": t.window,
                "oracle": {"producer": e.producer, "budget": e.budget},
                "oracle_tps": round(len(t.tokens) / catalog.seconds[e][i], 3),
                "deployed_tps": round(len(t.tokens) / catalog.seconds[deployed][i], 3),
            }
            for i, (t, e) in enumerate(zip(catalog.trajectories, best, strict=True))
        ],
    }


def _subset(catalog: Catalog, dataset: str) -> Catalog:
    keep = [i for i, t in enumerate(catalog.trajectories) if t.dataset == dataset]
    return Catalog(
        [catalog.trajectories[i] for i in keep],
        {entry: [row[i] for i in keep] for entry, row in catalog.seconds.items()},
        [catalog.target_seconds[i] for i in keep],
        catalog.fallbacks,
    )
