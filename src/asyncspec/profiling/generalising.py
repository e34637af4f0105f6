"""Selection that generalises beyond the windows it was made on (issue #29).

Pooled replay throughput alone picked, on a synthetic split, a configuration 10 % slower on real
speech. Three guards:
- **within noise, more windows won**: entries whose pooled throughput is within the replay's
  error of the best (REPLAY_NOISE) are tied; among them the one fastest on the most windows wins
  (then the higher pooled figure, then the smaller budget), so that one long window that favours
  an entry cannot carry the choice;
- **cross-validation across recordings**: each recording (a group of windows: its tempo variants
  go with it) is scored with the entry selected on the other recordings, which estimates what
  the procedure gives on audio it did not see. Reported beside the built-in default's figure;
- **a producer that keeps pace only just**: every entry is scored, per window, on the slower of
  its replay as collected and its replay with the producer PRODUCER_SLOWDOWN times slower
  (`hedged_catalog`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from asyncspec.profiling.costs import CostProfile
from asyncspec.profiling.selection import BUDGETS, Catalog, Entry, replay_catalog
from asyncspec.profiling.trajectory import Publication, WindowTrajectory

# The replay's measured mean absolute throughput error on real windows (2.3 %, issue #29) rounded
# up: entries closer than this cannot be told apart by replay.
REPLAY_NOISE = 0.025

# How much slower a producer may run than in the collection it was selected on. Measured
# (2026-12-03, 2-core AMD EPYC): two collections of the same 15 real windows gave the
# autoregressive producer spans, first start to last publication, 0.88-1.65x apart (median 1.15);
# bench ondevice's run on the LibriVox test windows was slower again. Scored as collected, the
# autoregressive producer won the split by 21 % and then reached 44 % of the oracle on the test
# windows: it finishes its window only just before the target needs it, so a slower producer
# turns every round into a wait. ct2-chunk publishes before the target's first round and is
# unaffected. The hedge charges each entry what it would cost on a slower day.
PRODUCER_SLOWDOWN = 1.25


def window_tps(catalog: Catalog, entry: Entry) -> list[float]:
    """The entry's throughput on each window (tokens over replayed seconds)."""
    return [
        len(t.tokens) / s if s > 0 else 0.0 for t, s in zip(catalog.trajectories, catalog.seconds[entry], strict=True)
    ]


def windows_won(catalog: Catalog, entries: list[Entry], windows: list[int]) -> dict[Entry, int]:
    """How many of `windows` each entry is fastest on (all entries tied for fastest count it)."""
    won = dict.fromkeys(entries, 0)
    for index in windows:
        fastest = min(catalog.seconds[entry][index] for entry in entries)
        for entry in entries:
            won[entry] += catalog.seconds[entry][index] <= fastest
    return won


def pooled_on(catalog: Catalog, entry: Entry, windows: list[int]) -> float:
    tokens = sum(len(catalog.trajectories[i].tokens) for i in windows)
    seconds = sum(catalog.seconds[entry][i] for i in windows)
    return tokens / seconds if seconds > 0 else 0.0


def robust_choice(catalog: Catalog, candidates: list[Entry], windows: list[int] | None = None) -> Entry:
    """Among `candidates`, on `windows` (default: all): the entries within REPLAY_NOISE of the best
    pooled throughput, then the one fastest on the most windows, the higher pooled figure, the
    smaller budget."""
    windows = list(range(len(catalog.trajectories))) if windows is None else windows
    pooled = {entry: pooled_on(catalog, entry, windows) for entry in candidates}
    best = max(pooled.values())
    tied = [entry for entry in candidates if pooled[entry] >= best * (1 - REPLAY_NOISE)]
    won = windows_won(catalog, tied, windows)
    return max(tied, key=lambda e: (won[e], pooled[e], -e.budget))


@dataclass(frozen=True)
class CrossValidation:
    """Leave one recording out: each recording scored with the entry chosen on the others."""

    groups: dict[str, Entry]  # recording -> the entry selected without it
    out_of_fold_tps: float  # pooled over every window, each under its fold's choice
    default_tps: float  # the built-in default on the same windows

    def as_dict(self) -> dict:
        return {
            "folds": {group: {"producer": e.producer, "budget": e.budget} for group, e in self.groups.items()},
            "out_of_fold_pooled_tps": round(self.out_of_fold_tps, 3),
            "default_pooled_tps": round(self.default_tps, 3),
        }


def cross_validate(catalog: Catalog, groups: list[str], candidates: list[Entry], default: Entry) -> CrossValidation:
    """`groups[i]`: the recording window i comes from; needs two recordings or more."""
    names = list(dict.fromkeys(groups))
    if len(names) < 2:
        raise ValueError("cross-validation needs windows from two recordings or more")
    chosen, seconds = {}, 0.0
    for name in names:
        held_out = [i for i, g in enumerate(groups) if g == name]
        rest = [i for i, g in enumerate(groups) if g != name]
        chosen[name] = robust_choice(catalog, candidates, rest)
        seconds += sum(catalog.seconds[chosen[name]][i] for i in held_out)
    return CrossValidation(chosen, catalog.tokens / seconds, catalog.pooled_tps(catalog.seconds[default]))


def rank_correlation(first: list[Entry], second: list[Entry]) -> float:
    """Spearman's rho between two rankings over the entries both contain (best first)."""
    common = [e for e in first if e in set(second)]
    if len(common) < 2:
        raise ValueError("rank correlation needs two common entries or more")
    position = {e: i for i, e in enumerate(e for e in second if e in set(common))}
    ranks_a, ranks_b = list(range(len(common))), [position[e] for e in common]
    return statistics.correlation(ranks_a, ranks_b)


def slowed(trajectory: WindowTrajectory, factor: float) -> WindowTrajectory:
    """The window with every producer's publications `factor` times later, measured from that
    producer's first start (a producer `factor` times slower; the target's side unchanged)."""
    return replace(trajectory, sources={name: _stretched(pubs, factor) for name, pubs in trajectory.sources.items()})


def _stretched(publications: list[Publication], factor: float) -> list[Publication]:
    if not publications:
        return publications
    origin = min(p.started for p in publications)
    return [
        replace(p, started=origin + (p.started - origin) * factor, published=origin + (p.published - origin) * factor)
        for p in publications
    ]


def hedged_catalog(
    trajectories: list[WindowTrajectory],
    profile: CostProfile,
    producers: list[str],
    budgets=BUDGETS,
    also: tuple[Entry, ...] = (),
    slowdown: float = PRODUCER_SLOWDOWN,
) -> Catalog:
    """`replay_catalog`, each entry charged per window the slower of its replay as collected and
    with its producer `slowdown` times slower."""
    nominal = replay_catalog(trajectories, profile, producers, budgets, also)
    slow = replay_catalog([slowed(t, slowdown) for t in trajectories], profile, producers, budgets, also)
    seconds = {
        entry: [max(pair) for pair in zip(row, slow.seconds[entry], strict=True)]
        for entry, row in nominal.seconds.items()
    }
    return Catalog(nominal.trajectories, seconds, nominal.target_seconds, nominal.fallbacks)
