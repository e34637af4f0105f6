"""`asyncspec replay`: price saved trajectories under a cost profile, or (--validate) check the
replay model against native As²d runs timed just after the profile was measured (seed 000 D.3)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from statistics import mean, median
from typing import Any, TypeVar, cast

from asyncspec.commands.profile import measure_profile, print_profile, profile_settings
from asyncspec.errors import InputError
from asyncspec.exactness import ExactnessCheck
from asyncspec.profiling.costs import CostProfile
from asyncspec.profiling.deployed import ProducerChoice
from asyncspec.profiling.replay import NativePricer, ProfilePricer, replay_as2d, replay_target_only, reprice_serial
from asyncspec.profiling.selection import rank, replay_catalog
from asyncspec.profiling.trajectory import WindowTrajectory, load_trajectories, save_trajectories

MAX_REPEATS = 20
Block = TypeVar("Block")


def run(args) -> int:
    if args.validate:
        return validate(args)
    if not args.trajectories or not args.profile:
        raise InputError("replay needs a trajectory file and --profile (or --validate)")
    trajectories = load_trajectories(args.trajectories)
    profile = CostProfile.load(args.profile)
    report = price_saved(trajectories, profile)
    _write(report, args.json or Path(args.out) / "replay.json")
    return 0


def price_saved(trajectories: list[WindowTrajectory], profile: CostProfile) -> dict[str, Any]:
    """Pooled replay TPS of target-only, every As²d (producer, budget), and recorded serial runs."""
    producers = sorted({name for t in trajectories for name in t.sources})
    catalog = replay_catalog(trajectories, profile, producers)
    target_tps = catalog.pooled_tps(catalog.target_seconds)
    ranking = [{"producer": e.producer, "budget": e.budget, "pooled_tps": round(tps, 3)} for e, tps in rank(catalog)]
    serial = {}
    for key in sorted({k for t in trajectories for k in t.native if k in ("sd", "specasr")}):
        runs = [reprice_serial(t, key, profile) for t in trajectories if key in t.native]
        serial[key] = round(sum(r.n_tokens for r in runs) / sum(r.time_s for r in runs), 3)
    print(f"target-only {target_tps:.2f} tok/s (replay, {len(trajectories)} windows, {catalog.tokens} tokens)")
    for row in ranking[:10]:
        print(f"  as2d {row['producer']:>16} budget {row['budget']:>2}: {row['pooled_tps']:.2f} tok/s")
    return {"target_pooled_tps": round(target_tps, 3), "as2d": ranking, "serial": serial}


def validate(args) -> int:
    from asyncspec.data.windows import directory_windows, librivox_windows
    from asyncspec.models.hf_whisper import WhisperBackend
    from asyncspec.models.registry import load_decoder
    from asyncspec.profiling.collect import collect, producers

    out = Path(args.out)
    choice = ProducerChoice.parse(args.producer)
    windows = directory_windows(args.audio) if args.audio else librivox_windows()
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise InputError(f"--repeats must be in 1..{MAX_REPEATS}")
    if args.calibrate_every < 0:
        raise InputError("--calibrate-every must be 0 (never) or a number of windows")
    windows = windows * args.repeats  # whole passes, so that each window's runs meet different moments
    target = cast(WhisperBackend, load_decoder(args.model, args.dtype))  # measure_profile refuses another kind
    if args.profile:
        profile, calibration = CostProfile.load(args.profile), None
    else:  # measured just before, frozen before any validation timing is seen
        profile, calibration = measure_profile(profile_settings(args, args.producer, args.budget + 1), out, target)
        profile.save(out / "replay_validate_profile.json")
    print_profile(profile)
    every = args.calibrate_every or len(windows)
    pairs: list[tuple[WindowTrajectory, CostProfile]] = []
    mismatches: list[str] = []
    block_profiles: list[dict[str, Any]] = []
    exactness = ExactnessCheck(target)
    recalibrate = None
    if calibration is not None and args.calibrate_every:
        recalibrate = lambda before: calibration.recalibrate(before, args.budget + 1)  # noqa: E731
    with producers([choice], args.producer_model, args.dtype, target) as workers:
        blocks = (
            collect(target, workers, windows[start : start + every], args.budget, "replay --validate")
            for start in range(0, len(windows), every)
        )
        for collection, block_profile in bracketed(blocks, profile, recalibrate):
            runs, profile_json = len(collection.trajectories), block_profile.to_json()
            block_profiles.append({"first_run": len(pairs), "runs": runs, "profile": profile_json})
            pairs += [(t, block_profile) for t in collection.trajectories]
            mismatches += collection.mismatches
            exactness.absorb(collection.exactness)
    save_trajectories(out / "replay_validate_trajectories.json", [t for t, _ in pairs])
    if recalibrate is not None:  # what priced each block, so that the replay can be re-run offline
        (out / "replay_validate_block_profiles.json").write_text(json.dumps(block_profiles))
    if any(f"as2d:{choice.name}" in t.native for t, _ in pairs):
        report = agreement(pairs, choice.name, args.budget)
        print_agreement(report)
    else:  # every As²d run differed from target-only: nothing to replay, the verdict below says why
        report = {"producer": choice.name, "budget": args.budget, "windows": 0, "rows": []}
    report.update(
        mismatches=mismatches, calibrate_every=args.calibrate_every, repeats=args.repeats, load_average=os.getloadavg()
    )
    report["exactness"] = exactness.as_json()
    _write(report, args.json or out / "replay_validate.json")
    return exactness.report()


def bracketed(
    blocks: Iterable[Block], profile: CostProfile, recalibrate: Callable[[CostProfile], CostProfile] | None
) -> Iterator[tuple[Block, CostProfile]]:
    """Each block (run when asked for) with the profile to price it by. With `recalibrate`, the
    costs are measured again just after each block, and the block is priced with those pooled
    with the costs measured just before it: the machine's speed drifts by more than the replay's
    own error within minutes, so a block is priced at its middle. Without, every block by `profile`."""
    for block in blocks:
        if recalibrate is None:
            yield block, profile
            continue
        after = recalibrate(profile)
        yield block, profile.pooled_with(after)
        profile = after  # the next block's costs before


def agreement(pairs: list[tuple[WindowTrajectory, CostProfile]], producer: str, budget: int) -> dict:
    """Per window: native vs replayed TPS under the profile calibrated before it (As²d and
    target-only), and a self-check that replaying with the native run's own durations reproduces
    its time exactly."""
    rows: list[dict[str, Any]] = []
    for t, profile in pairs:
        key = f"as2d:{producer}"
        if key not in t.native:
            continue
        native = t.native[key]
        replayed = replay_as2d(t, producer, budget, ProfilePricer(profile))
        own = replay_as2d(t, producer, budget, NativePricer(native))
        target = replay_target_only(t, ProfilePricer(profile, target_only=True))
        native_target = t.native["target"]
        rows.append(
            {
                "window": t.window,
                "dataset": t.dataset,
                "tokens": len(t.tokens),
                "native_tps": round(native.n_tokens / native.decode_s, 3),
                "replay_tps": round(replayed.tps, 3),
                "tps_error_pct": round(100 * (replayed.tps / (native.n_tokens / native.decode_s) - 1), 3),
                "native_time_s": round(native.decode_s, 5),
                "replay_time_s": round(replayed.time_s, 5),
                "native_pricer_time_error_s": own.time_s - native.decode_s,
                "target_native_tps": round(native_target.n_tokens / native_target.decode_s, 3),
                "target_replay_tps": round(target.tps, 3),
                "target_tps_error_pct": round(
                    100 * (target.tps / (native_target.n_tokens / native_target.decode_s) - 1), 3
                ),
            }
        )
    if not rows:
        raise InputError("no window has a replayable As²d trajectory")
    windows = per_window(rows)
    tokens = sum(r["tokens"] for r in rows)
    pooled_native = tokens / sum(r["native_time_s"] for r in rows)
    pooled_replay = tokens / sum(r["replay_time_s"] for r in rows)
    return {
        "producer": producer,
        "budget": budget,
        "windows": len(windows),
        "runs": len(rows),
        "mean_abs_tps_error_pct": round(mean(abs(w["tps_error_pct"]) for w in windows), 3),
        "mean_signed_tps_error_pct": round(mean(w["tps_error_pct"] for w in windows), 3),
        "pooled_tps_error_pct": round(100 * (pooled_replay / pooled_native - 1), 3),
        "target_mean_abs_tps_error_pct": round(mean(abs(w["target_tps_error_pct"]) for w in windows), 3),
        "native_run_to_run_pct": run_to_run(rows, "native_tps"),
        "target_run_to_run_pct": run_to_run(rows, "target_native_tps"),
        "native_pricer_max_abs_error_s": max(abs(r["native_pricer_time_error_s"]) for r in rows),
        "per_window": windows,
        "rows": rows,
    }


def per_window(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each window's median native and replayed TPS over its runs, and the error between them:
    one native run is one draw of the machine's speed, the median of several is what replay prices."""
    windows = []
    for (dataset, window), runs in _by_window(rows).items():
        figures = {key: median(r[key] for r in runs) for key in _MEDIANS}
        windows.append(
            {"window": window, "dataset": dataset, "tokens": runs[0]["tokens"], "runs": len(runs)}
            | {key: round(value, 3) for key, value in figures.items()}
            | {
                "tps_error_pct": round(100 * (figures["replay_tps"] / figures["native_tps"] - 1), 3),
                "target_tps_error_pct": round(
                    100 * (figures["target_replay_tps"] / figures["target_native_tps"] - 1), 3
                ),
            }
        )
    return windows


_MEDIANS = ("native_tps", "replay_tps", "target_native_tps", "target_replay_tps")


def _by_window(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The runs of each (dataset, window), in order."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((row["dataset"], row["window"]), []).append(row)
    return grouped


def run_to_run(rows: list[dict[str, Any]], key: str) -> float | None:
    """Mean absolute deviation of one run's TPS from its window's median, in percent (None with one
    run per window): the noise a single native run carries, below which no replay can agree with it."""
    figures = [[run[key] for run in runs] for runs in _by_window(rows).values()]
    deviations = [abs(v / median(runs) - 1) for runs in figures if len(runs) > 1 for v in runs]
    return round(100 * mean(deviations), 3) if deviations else None


def print_agreement(report: dict) -> None:
    print(f"{'window':>12} {'tokens':>6} {'runs':>4} {'native tok/s':>12} {'replay tok/s':>12} {'error':>8}")
    for r in report["per_window"]:
        print(
            f"{r['window']:>12} {r['tokens']:>6} {r['runs']:>4} {r['native_tps']:>12.2f} {r['replay_tps']:>12.2f} "
            f"{r['tps_error_pct']:>7.2f}%"
        )
    print(
        f"As²d ({report['producer']}, budget {report['budget']}) over {report['windows']} windows: mean absolute TPS "
        f"error {report['mean_abs_tps_error_pct']:.2f}%, mean signed {report['mean_signed_tps_error_pct']:.2f}%, "
        f"pooled {report['pooled_tps_error_pct']:.2f}%; target-only mean absolute "
        f"{report['target_mean_abs_tps_error_pct']:.2f}%; replay with native durations off by at most "
        f"{report['native_pricer_max_abs_error_s']:.2e} s"
    )
    if report["native_run_to_run_pct"] is not None:
        print(
            f"medians of {report['runs']} runs; one run differs from its window's median by "
            f"{report['native_run_to_run_pct']:.2f}% on average (target-only {report['target_run_to_run_pct']:.2f}%)"
        )
    if report.get("mismatches"):
        print(f"outputs differing from target-only (not replayed): {', '.join(report['mismatches'])}")


def _write(report: dict, path: Path | str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
