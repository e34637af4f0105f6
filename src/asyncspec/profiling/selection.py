"""Offline configuration selection and the per-window oracle (seed 000 App. D.2.6, D.4.3).

Every (producer, budget) in the catalog is replayed on every window under one cost profile.
Selection ranks them by pooled throughput (all tokens over all time) on development windows;
the oracle picks, with hindsight and at no cost, the fastest entry for each test window.
A window where a producer's native run differed from target-only has no replayable trajectory
for it; that entry is charged target-only time there (counted, never dropped)."""

from __future__ import annotations

from dataclasses import dataclass

from asyncspec.errors import InputError
from asyncspec.profiling.costs import CostProfile
from asyncspec.profiling.replay import ProfilePricer, replay_as2d, replay_target_only
from asyncspec.profiling.trajectory import WindowTrajectory

BUDGETS = tuple(range(1, 25))


@dataclass(frozen=True)
class Entry:
    producer: str
    budget: int


@dataclass
class Catalog:
    """Replayed seconds per entry and window, plus target-only seconds per window."""

    trajectories: list[WindowTrajectory]
    seconds: dict[Entry, list[float]]
    target_seconds: list[float]
    fallbacks: int  # (entry, window) pairs charged target-only time

    @property
    def tokens(self) -> int:
        return sum(len(t.tokens) for t in self.trajectories)

    def pooled_tps(self, seconds: list[float]) -> float:
        total = sum(seconds)
        return self.tokens / total if total > 0 else 0.0


def replay_catalog(
    trajectories: list[WindowTrajectory],
    profile: CostProfile,
    producers: list[str],
    budgets=BUDGETS,
    also: tuple[Entry, ...] = (),
) -> Catalog:
    """Every producer x budget, plus the entries `also` names (e.g. the built-in default, scored
    beside a catalog that leaves it out)."""
    pricer, target_pricer = ProfilePricer(profile), ProfilePricer(profile, target_only=True)
    target_seconds = [replay_target_only(t, target_pricer).time_s for t in trajectories]
    entries = [Entry(producer, budget) for producer in producers for budget in budgets]
    seconds, fallbacks = {}, 0
    for entry in dict.fromkeys([*entries, *also]):
        row = []
        for trajectory, fallback in zip(trajectories, target_seconds, strict=True):
            if entry.producer in trajectory.sources:
                row.append(replay_as2d(trajectory, entry.producer, entry.budget, pricer).time_s)
            else:
                row.append(fallback)
                fallbacks += 1
        seconds[entry] = row
    return Catalog(trajectories, seconds, target_seconds, fallbacks)


def rank(catalog: Catalog) -> list[tuple[Entry, float]]:
    """Entries by pooled replay throughput, best first (ties: smaller budget first)."""
    pooled = [(entry, catalog.pooled_tps(row)) for entry, row in catalog.seconds.items()]
    return sorted(pooled, key=lambda item: (-item[1], item[0].budget, item[0].producer))


@dataclass(frozen=True)
class Selection:
    """The fastest candidate on the development split, and the built-in default scored beside it."""

    chosen: Entry
    chosen_tps: float
    default: Entry
    default_tps: float
    # cross-validation: pooled throughput of each recording under the choice made without it
    out_of_fold_tps: float | None = None

    @property
    def refusal(self) -> str | None:
        """Why the chosen entry must not be deployed (it is slower than the default it would
        replace, or choices made this way were slower than it on recordings they did not see), or None."""
        if self.chosen_tps >= self.default_tps:
            if self.out_of_fold_tps is None or self.out_of_fold_tps >= self.default_tps or self.chosen == self.default:
                return None
            return (
                f"not deploying {self.chosen.producer} budget {self.chosen.budget}: chosen this way without a "
                f"recording, the choice was slower on it ({self.out_of_fold_tps:.2f} tok/s pooled out of fold) than "
                f"the built-in default {self.default.producer} budget {self.default.budget} ({self.default_tps:.2f})"
            )
        return (
            f"not deploying {self.chosen.producer} budget {self.chosen.budget}: {self.chosen_tps:.2f} tok/s on the "
            f"development split, slower than the built-in default {self.default.producer} budget "
            f"{self.default.budget} ({self.default_tps:.2f} tok/s)"
        )


def select(catalog: Catalog, candidates: list[Entry], default: Entry, choose=None) -> Selection:
    """The choice among `candidates` (`choose(catalog, candidates)`; by default the best by pooled
    replay throughput, `rank`'s order), beside `default`'s score; both must be in the catalog."""
    if choose is None:
        allowed = set(candidates)
        chosen = next(entry for entry, _ in rank(catalog) if entry in allowed)
    else:
        chosen = choose(catalog, candidates)
    pooled = catalog.pooled_tps
    return Selection(chosen, pooled(catalog.seconds[chosen]), default, pooled(catalog.seconds[default]))


def _best_entry(catalog: Catalog, window: int) -> Entry:
    """The entry fastest on one window (the smaller budget on a tie)."""
    return min(catalog.seconds, key=lambda entry: (catalog.seconds[entry][window], entry.budget))


def oracle(catalog: Catalog) -> tuple[float, list[Entry]]:
    """Pooled TPS when every window gets its own hindsight-best entry, and those entries."""
    best = [_best_entry(catalog, i) for i in range(len(catalog.trajectories))]
    seconds = [catalog.seconds[entry][i] for i, entry in enumerate(best)]
    return catalog.pooled_tps(seconds), best


def ensure_disjoint(deployed, test_fingerprints: list[str]) -> None:
    """Test windows must not have been part of the development split the deployment was chosen on."""
    development = set(deployed.development.get("fingerprints", []))
    shared = development.intersection(test_fingerprints)
    if shared:
        raise InputError(
            f"{len(shared)} test window(s) were in the development split used by select-budget; "
            "select on other audio (select-budget --audio DIR) before measuring headroom on these"
        )
