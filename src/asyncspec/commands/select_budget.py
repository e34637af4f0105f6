"""`asyncspec select-budget`: choose As²d's fixed (producer, budget) offline, by pooled replay
throughput (each window charged its slowest of several collections: profiling/generalising.py) on a development split
that shares no audio with the test windows (seed 000 D.2.6), and write it where `transcribe`,
`demo` and the benchmarks read it. The built-in default (ct2-chunk@4s at As²d's default budget)
is always scored beside the catalog; a selection slower than it is refused: reported, exit 0, nothing deployed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import cast

from asyncspec.commands.profile import measure_profile, plot_saving, profile_settings
from asyncspec.data.real_devset import recording_of
from asyncspec.decoding.as2d import DEFAULT_BUDGET
from asyncspec.errors import InputError
from asyncspec.profiling.costs import CostProfile
from asyncspec.profiling.deployed import (
    DEFAULT_PRODUCER,
    DeployedConfig,
    ProducerChoice,
    parse_catalog,
    save_deployed,
)
from asyncspec.profiling.generalising import (
    cross_validate,
    rank_correlation,
    robust_choice,
    slowest_of,
)
from asyncspec.profiling.selection import BUDGETS, Catalog, Entry, Selection, rank, replay_catalog, select
from asyncspec.profiling.trajectory import save_trajectories

# The configuration every command runs when none is deployed: always scored, so that a selection
# slower than it is refused rather than deployed.
DEFAULT_ENTRY = Entry(DEFAULT_PRODUCER, DEFAULT_BUDGET)
MAX_COLLECTIONS = 10


def run(args) -> int:
    out = Path(args.out)
    choices = parse_catalog(args.producers)
    if not 1 <= args.max_budget <= max(BUDGETS):
        raise InputError(f"--max-budget must be in 1..{max(BUDGETS)}")
    if not 1 <= args.collections <= MAX_COLLECTIONS:
        raise InputError(f"--collections must be in 1..{MAX_COLLECTIONS}")
    widest = max(args.max_budget, DEFAULT_BUDGET) + 1  # the default's budget is replayed too
    profile_path = args.profile or str(out / "profile.json")
    profile = CostProfile.load(args.profile) if args.profile else _measure(args, out, profile_path, widest)
    if max(profile.widths) < widest:
        raise InputError(f"the profile covers K <= {max(profile.widths)}; budgets up to {widest - 1} need more")
    split = DevelopmentSplit(args, profile, choices)
    windows = _development_windows(args, out)
    catalog, collection, per_collection = split.catalog(
        windows, "development split", out / "select_budget_trajectories.json"
    )
    if not collection.exactness.passed:  # an As²d run differing from target-only is a defect: deploy nothing
        return collection.exactness.report()
    candidates = [*split.entries, DEFAULT_ENTRY]
    cross_validation = _cross_validation(catalog, candidates)
    selection = select(catalog, candidates, DEFAULT_ENTRY, robust_choice)
    if cross_validation:  # a selection that did not generalise across recordings is refused
        selection = replace(selection, out_of_fold_tps=cross_validation["out_of_fold_pooled_tps"])
    ranking = rank(catalog)
    deployed = _deployed_config(args, catalog, ranking, selection, profile, profile_path, collection.mismatches)
    path = deploy(selection, deployed, Path(args.config) if args.config else None)
    report = deployed.development | {
        "split": "--audio" if args.audio else args.split,
        "selected": selection.chosen.__dict__ | {"pooled_tps": deployed.pooled_tps},
        "built_in_default": selection.default.__dict__ | {"pooled_tps": deployed.default_pooled_tps},
        "deployed": str(path) if path else None,
        "refused": selection.refusal,
        "collections": spread(per_collection, selection),
        "cross_validation": cross_validation,
        "secondary": split.secondary(ranking, out) if args.secondary != "none" else None,
    }
    (out / "select_budget.json").write_text(json.dumps(report, indent=1))
    _print_selection(catalog, ranking, report["collections"], report["cross_validation"], report["secondary"])
    plot_budgets(catalog, out / "select_budget.png")
    _print_outcome(selection, path, len(catalog.trajectories), out)
    return collection.exactness.report()


class DevelopmentSplit:
    """Collects a split's windows under every scored producer and replays the catalog on them."""

    def __init__(self, args, profile: CostProfile, choices: list[ProducerChoice]):
        from asyncspec.models.hf_whisper import WhisperBackend
        from asyncspec.models.registry import load_decoder

        self.args, self.profile = args, profile
        self.names = [c.name for c in choices]
        self.budgets = range(1, args.max_budget + 1)
        self.entries = [Entry(name, budget) for name in self.names for budget in self.budgets]
        self.scored = list(dict.fromkeys([*choices, ProducerChoice.parse(DEFAULT_PRODUCER)]))
        self.target = cast(WhisperBackend, load_decoder(args.model, args.dtype))  # --model: a speech model

    def catalog(self, windows, label: str, trajectories: Path):
        """The catalog over `args.collections` collections of the windows (each entry charged per
        window its slowest replay), and the collections; each one's trajectories are saved."""
        from asyncspec.profiling.collect import collect, merged, producers

        collections = []
        with producers(self.scored, self.args.producer_model, self.args.dtype, self.target) as workers:
            for number in range(1, self.args.collections + 1):
                of = f" {number}/{self.args.collections}" if self.args.collections > 1 else ""
                collection = collect(self.target, workers, windows, DEFAULT_BUDGET, f"select-budget ({label}{of})")
                path = trajectories if number == 1 else trajectories.with_name(f"{trajectories.stem}_{number}.json")
                save_trajectories(path, collection.trajectories)
                collections.append(collection)
        catalogs = [
            replay_catalog(c.trajectories, self.profile, self.names, self.budgets, (DEFAULT_ENTRY,))
            for c in collections
        ]
        return slowest_of(catalogs), merged(collections), catalogs

    def secondary(self, ranking, out: Path) -> dict:
        """The Festival split's ranking beside the development split's: Spearman's rho."""
        from asyncspec.data.devset import synthesize_dev_set
        from asyncspec.data.windows import directory_windows

        synthesize_dev_set(out / "dev-festival")
        windows = directory_windows(str(out / "dev-festival"))
        path = out / "select_budget_trajectories_festival.json"
        catalog, collection, _ = self.catalog(windows, "festival split", path)
        festival = rank(catalog)
        rho = rank_correlation([e for e, _ in ranking], [e for e, _ in festival])
        best = festival[0][0]
        return {
            "split": "festival",
            "windows": len(catalog.trajectories),
            "exact": collection.exactness.passed,
            "best": {"producer": best.producer, "budget": best.budget, "pooled_tps": round(festival[0][1], 3)},
            "spearman_rho": round(rho, 3),
        }


def spread(catalogs: list[Catalog], selection: Selection) -> list[dict]:
    """Per collection: the selected entry's and the default's pooled throughput, as collected."""
    return [
        {
            "selected_pooled_tps": round(one.pooled_tps(one.seconds[selection.chosen]), 3),
            "default_pooled_tps": round(one.pooled_tps(one.seconds[selection.default]), 3),
        }
        for one in catalogs
    ]


def _cross_validation(catalog: Catalog, candidates: list[Entry]) -> dict | None:
    """Leave one recording out over the development split (None: one recording only)."""
    groups = [recording_of(t.window.split("/")[-1]) for t in catalog.trajectories]
    if len(set(groups)) < 2:
        return None
    return cross_validate(catalog, groups, candidates, DEFAULT_ENTRY).as_dict()


def deploy(selection: Selection, deployed: DeployedConfig, path: Path | None) -> Path | None:
    """Write the selected configuration where every command reads it, unless it is slower than the
    built-in default on the split it was selected on: then nothing is written (None)."""
    return None if selection.refusal else save_deployed(deployed, path)


def _development_windows(args, out: Path):
    """--audio's windows, or the split --split names assembled under out/."""
    from asyncspec.data.devset import synthesize_dev_set
    from asyncspec.data.real_devset import assemble_real_dev_set
    from asyncspec.data.windows import directory_windows

    if args.audio:
        return directory_windows(args.audio)
    directory = out / f"dev-{args.split}"
    (assemble_real_dev_set if args.split == "real" else synthesize_dev_set)(directory)
    return directory_windows(str(directory))


def _deployed_config(
    args, catalog: Catalog, ranking, selection: Selection, profile: CostProfile, profile_path, mismatches
):
    return DeployedConfig(
        producer=selection.chosen.producer,
        producer_model=args.producer_model,
        budget=selection.chosen.budget,
        pooled_tps=round(selection.chosen_tps, 3),
        default_pooled_tps=round(selection.default_tps, 3),
        development={
            "windows": [t.window for t in catalog.trajectories],
            "fingerprints": [t.fingerprint for t in catalog.trajectories],
            "tokens": catalog.tokens,
            "target_pooled_tps": round(catalog.pooled_tps(catalog.target_seconds), 3),
            "profile": str(Path(profile_path).resolve()),
            "device": profile.device,
            "fallbacks": catalog.fallbacks,
            "mismatches": mismatches,
            "ranking": [{"producer": e.producer, "budget": e.budget, "pooled_tps": round(t, 3)} for e, t in ranking],
        },
    )


def _print_outcome(selection: Selection, path: Path | None, windows: int, out: Path) -> None:
    chosen, default = selection.chosen, selection.default
    figures = (
        f"{selection.chosen_tps:.2f} tok/s pooled replay on {windows} development windows; the built-in default "
        f"{default.producer} budget {default.budget}: {selection.default_tps:.2f} tok/s"
    )
    written = f"{out / 'select_budget.json'}, {out / 'select_budget.png'}"
    if path is None:
        print(f"{selection.refusal}; nothing deployed (the configuration file is left as it was); wrote {written}")
    else:
        print(f"selected {chosen.producer} budget {chosen.budget} ({figures}); wrote {path}, {written}")


def _measure(args, out: Path, path: str, widest: int) -> CostProfile:
    producer = args.producers.split(",")[0].strip()
    profile, _ = measure_profile(profile_settings(args, producer, widest), out)
    profile.save(path)
    plot_saving(profile, Path(path).with_name("profile_saving.png"))
    return profile


def _print_selection(
    catalog: Catalog, ranking, spread: list[dict], cross_validation: dict | None, secondary: dict | None
) -> None:
    target = catalog.pooled_tps(catalog.target_seconds)
    print(
        f"development split: {len(catalog.trajectories)} windows, {catalog.tokens} tokens; "
        f"target-only {target:.2f} tok/s (replay); each entry per window its slowest replay over "
        f"{len(spread)} collection(s)"
    )
    for entry, tps in ranking[:8]:
        default = " (built-in default)" if entry == DEFAULT_ENTRY else ""
        print(f"  {entry.producer:>16} budget {entry.budget:>2}: {tps:6.2f} tok/s ({tps / target:.2f}x){default}")
    if len(spread) > 1:
        selected = ", ".join(f"{c['selected_pooled_tps']:.2f}" for c in spread)
        default = ", ".join(f"{c['default_pooled_tps']:.2f}" for c in spread)
        print(f"per collection: the selection {selected} tok/s; the built-in default {default} tok/s")
    if cross_validation:
        print(
            f"leave one recording out: {cross_validation['out_of_fold_pooled_tps']:.2f} tok/s out of fold, "
            f"the built-in default {cross_validation['default_pooled_tps']:.2f} tok/s"
        )
    if secondary:
        rho = secondary["spearman_rho"]
        print(f"Festival split: best {secondary['best']}, Spearman's rho with this split's ranking {rho}")


def plot_budgets(catalog: Catalog, path: Path) -> None:
    from asyncspec.plots import plt, save

    figure, axis = plt.subplots(figsize=(8, 4.2))
    for producer in sorted({e.producer for e in catalog.seconds}):
        entries = sorted((e for e in catalog.seconds if e.producer == producer), key=lambda e: e.budget)
        axis.plot(
            [e.budget for e in entries],
            [catalog.pooled_tps(catalog.seconds[e]) for e in entries],
            "o-",
            label=producer,
            markersize=3,
        )
    axis.axhline(catalog.pooled_tps(catalog.target_seconds), color="gray", linestyle="--", label="target-only")
    axis.set(
        xlabel="As²d budget (proposals per round)",
        ylabel="pooled replay tok/s",
        title="Offline budget selection on the development split",
    )
    axis.grid(alpha=0.3)
    axis.legend()
    save(figure, path, dpi=120)
