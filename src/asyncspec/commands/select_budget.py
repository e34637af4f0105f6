"""`asyncspec select-budget`: choose As²d's fixed (producer, budget) offline, by pooled replay
throughput on a development split that shares no audio with the test windows (seed 000 D.2.6),
and write it where `transcribe`, `demo` and the benchmarks read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from asyncspec.commands.profile import measure_profile, plot_saving, profile_settings
from asyncspec.decoding.as2d import DEFAULT_BUDGET
from asyncspec.errors import InputError
from asyncspec.profiling.costs import CostProfile
from asyncspec.profiling.deployed import DeployedConfig, parse_catalog, save_deployed
from asyncspec.profiling.selection import BUDGETS, Catalog, rank, replay_catalog
from asyncspec.profiling.trajectory import save_trajectories


def run(args) -> int:
    from asyncspec.data.devset import synthesize_dev_set
    from asyncspec.data.windows import directory_windows
    from asyncspec.models.hf_whisper import WhisperBackend
    from asyncspec.models.registry import load_decoder
    from asyncspec.profiling.collect import collect, producers

    out = Path(args.out)
    choices = parse_catalog(args.producers)
    if not 1 <= args.max_budget <= max(BUDGETS):
        raise InputError(f"--max-budget must be in 1..{max(BUDGETS)}")
    profile_path = args.profile or str(out / "profile.json")
    profile = CostProfile.load(args.profile) if args.profile else _measure(args, out, profile_path)
    if max(profile.widths) < args.max_budget + 1:
        raise InputError(f"the profile covers K <= {max(profile.widths)}; budgets up to {args.max_budget} need more")
    if args.audio:
        windows = directory_windows(args.audio)
    else:
        synthesize_dev_set(out / "dev")
        windows = directory_windows(str(out / "dev"))
    target = cast(WhisperBackend, load_decoder(args.model, args.dtype))  # --model: a speech model
    with producers(choices, args.producer_model, args.dtype, target) as workers:
        collection = collect(target, workers, windows, DEFAULT_BUDGET, "select-budget (development split)")
    save_trajectories(out / "select_budget_trajectories.json", collection.trajectories)
    if not collection.exactness.passed:  # an As²d run differing from target-only is a defect: deploy nothing
        return collection.exactness.report()
    catalog = replay_catalog(collection.trajectories, profile, [c.name for c in choices], range(1, args.max_budget + 1))
    ranking = rank(catalog)
    best, best_tps = ranking[0]
    deployed = DeployedConfig(
        producer=best.producer,
        producer_model=args.producer_model,
        budget=best.budget,
        pooled_tps=round(best_tps, 3),
        development={
            "windows": [t.window for t in catalog.trajectories],
            "fingerprints": [t.fingerprint for t in catalog.trajectories],
            "tokens": catalog.tokens,
            "target_pooled_tps": round(catalog.pooled_tps(catalog.target_seconds), 3),
            "profile": str(Path(profile_path).resolve()),
            "device": profile.device,
            "fallbacks": catalog.fallbacks,
            "mismatches": collection.mismatches,
            "ranking": [{"producer": e.producer, "budget": e.budget, "pooled_tps": round(t, 3)} for e, t in ranking],
        },
    )
    path = save_deployed(deployed, Path(args.config) if args.config else None)
    (out / "select_budget.json").write_text(json.dumps(deployed.development | {"selected": best.__dict__}, indent=1))
    _print_selection(catalog, ranking)
    plot_budgets(catalog, out / "select_budget.png")
    print(
        f"selected {best.producer} budget {best.budget} ({best_tps:.2f} tok/s pooled replay on "
        f"{len(catalog.trajectories)} development windows); wrote {path}, {out / 'select_budget.json'}, "
        f"{out / 'select_budget.png'}"
    )
    return collection.exactness.report()


def _measure(args, out: Path, path: str) -> CostProfile:
    producer = args.producers.split(",")[0].strip()
    profile, _ = measure_profile(profile_settings(args, producer, args.max_budget + 1), out)
    profile.save(path)
    plot_saving(profile, Path(path).with_name("profile_saving.png"))
    return profile


def _print_selection(catalog: Catalog, ranking) -> None:
    target = catalog.pooled_tps(catalog.target_seconds)
    print(
        f"development split: {len(catalog.trajectories)} windows, {catalog.tokens} tokens; "
        f"target-only {target:.2f} tok/s (replay)"
    )
    for entry, tps in ranking[:8]:
        print(f"  {entry.producer:>16} budget {entry.budget:>2}: {tps:6.2f} tok/s ({tps / target:.2f}x)")


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
