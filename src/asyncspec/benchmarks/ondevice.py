"""`asyncspec bench ondevice`: target-only, sd (mean over budgets 5-8, as in the paper), specasr
and as2d on the same real-speech windows, interleaved per window so the methods share machine
drift. Prints per-dataset and pooled tables, writes JSON and PNG plots (TPS CDF, a timeline)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import mean
from typing import Any

from asyncspec.audio import SAMPLE_RATE
from asyncspec.benchmarks.oracle import Headroom, plot_headroom
from asyncspec.data.devset import synthesize_dev_set
from asyncspec.data.real_devset import assemble_held_out
from asyncspec.data.windows import directory_windows, librivox_windows
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.exactness import ExactnessCheck
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.run.compare import equality_check
from asyncspec.run.models import load_models
from asyncspec.run.options import DecodingOptions, decode_config
from asyncspec.run.report import progress
from asyncspec.run.summary import comparison_records

METHOD_ORDER = ["target", "sd", "specasr", "as2d"]
SD_BUDGETS = (5, 6, 7, 8)
SERIAL = ("sd", "specasr")


def run_window(
    target, drafters, samples, methods, config: DecodeConfig, exactness: ExactnessCheck | None = None, where: str = ""
) -> tuple[list[dict[str, Any]], list]:
    """Records of every method on one window, and the results (target-only first). With
    `exactness`, every run (each sd budget's included) is checked against target-only."""
    request = target.request(samples)
    results, sd_runs = [], []
    for method in methods:
        if method == "sd":
            sd_runs = [METHODS["sd"](target, drafters["sd"], request, DecodeConfig(budget=b)) for b in SD_BUDGETS]
            results.append(_mean_sd(sd_runs))
        else:
            results.append(METHODS[method](target, drafters.get(method), request, config))
    records = comparison_records(results, target, compared=exactness is not None)
    if exactness is None:
        return records, results
    reference = results[0].tokens  # target-only runs first
    runs = [(r.method, r) for r in results[1:] if r.method != "sd"]
    runs += [(f"sd (budget {b})", run) for b, run in zip(SD_BUDGETS, sd_runs, strict=True)] if sd_runs else []
    equal = {name: exactness.check(where, name, request, reference, run.tokens) for name, run in runs}
    for record in records:
        if record["method"] == "sd":  # equal only if every budget's run equals target-only
            record["equal_to_target"] = all(equal[f"sd (budget {b})"] for b in SD_BUDGETS)
    return records, results


def _mean_sd(runs: list) -> Any:
    """The paper's SD figure: the budget-7 run's record with the mean TPS over budgets 5..8."""
    shown = runs[SD_BUDGETS.index(7)]
    if shown.tokens:
        shown.stats.decode_s = len(shown.tokens) / mean(run.tps for run in runs)
    shown.stats.notes = {"sd_budget_tps": {b: round(r.tps, 2) for b, r in zip(SD_BUDGETS, runs, strict=True)}}
    return shown


def _windows(args):
    """--audio's, the Festival split (--dev), the held-out CMU recordings, or the LibriVox windows."""
    if args.dev or args.held_out:
        directory = Path(args.out) / ("dev" if args.dev else "held-out")
        (synthesize_dev_set if args.dev else assemble_held_out)(directory)
        return directory_windows(str(directory))
    return directory_windows(args.audio) if args.audio else librivox_windows()


def run(args) -> int:
    options = DecodingOptions.from_args(args)
    methods = [m for m in METHOD_ORDER if m in options.methods or m == "target"]
    config = decode_config(options)
    windows = _windows(args)
    records = []
    with Headroom(args, options) as oracle, load_models(options, WhisperBackend, "speech") as (target, drafters):
        oracle.start(target)
        exactness = equality_check(target, config, compare=True)
        for dataset, name, samples in progress(windows, len(windows), "bench ondevice"):
            where = f"{dataset} window {name}"
            window_records, results = run_window(target, drafters, samples, methods, config, exactness, where)
            for record in window_records:
                record.update(dataset=dataset, window=name, seconds=round(len(samples) / SAMPLE_RATE, 2))
                records.append(record)
            oracle.observe(dataset, name, samples, results, exactness)
    report = build_report(records, methods, options)
    report["oracle"] = oracle.report()
    report["exactness"] = exactness.as_json() if exactness else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_ondevice.json").write_text(json.dumps(report, indent=1))  # saved before anything can fail
    print_report(report)
    plot_cdf(records, methods, out / "bench_ondevice_cdf.png")
    plot_timeline(records, out / "bench_ondevice_timeline.png")
    if report["oracle"]:
        plot_headroom(report["oracle"], out / "bench_ondevice_oracle.png")
    print(f"wrote {out / 'bench_ondevice.json'}, bench_ondevice_cdf.png, bench_ondevice_timeline.png")
    return exactness.report() if exactness else 0


def _pooled(records: list[dict]) -> float:
    seconds = sum(r["decode_s"] for r in records)
    return sum(r["n_tokens"] for r in records) / seconds if seconds else 0.0


def method_figures(records: list[dict], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method, over the windows where its output equals target-only: a mismatched window is
    never pooled (`mismatched_windows` counts them), and ratios compare with target-only on the
    same windows."""
    by_method = {m: [r for r in records if r["method"] == m] for m in methods}
    kept = {m: [r for r in rows if r.get("equal_to_target") is not False] for m, rows in by_method.items()}
    target_rows = {r["window"]: r for r in by_method["target"]}
    pooled = {m: _pooled(rs) for m, rs in kept.items()}
    serial_best = max((pooled[m] for m in SERIAL if m in pooled), default=0.0)
    figures = {}
    for method, rows in kept.items():
        target_pooled = _pooled([target_rows[r["window"]] for r in rows])
        figures[method] = {
            "windows": len(by_method[method]),
            "mismatched_windows": len(by_method[method]) - len(rows),
            "pooled_tps": round(pooled[method], 3),
            "ratio_to_target": round(pooled[method] / target_pooled, 3) if target_pooled else None,
            "ratio_to_best_serial": round(pooled[method] / serial_best, 3) if serial_best else None,
            "slower_than_target_fraction": round(
                sum(r["tps"] < target_rows[r["window"]]["tps"] for r in rows) / len(rows), 3
            )
            if rows
            else None,
            "equal_windows": sum(bool(r["equal_to_target"]) for r in by_method[method]),
            "tokens": sum(r["n_tokens"] for r in rows),
        }
    return figures


def build_report(records: list[dict], methods: list[str], options: DecodingOptions) -> dict[str, Any]:
    datasets = sorted({r["dataset"] for r in records})
    as2d_rows = [r for r in records if r["method"] == "as2d"]
    return {
        "model": options.model,
        "drafter": options.drafter,
        "producer": options.producer,
        "producer_model": options.producer_model,
        "dtype": options.dtype,
        "as2d_budget": options.budget,
        "chunk_s": options.chunk_s,
        "as2d": options.as2d_record(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "methods": method_figures(records, methods),
        "datasets": {d: method_figures([r for r in records if r["dataset"] == d], methods) for d in datasets},
        "as2d_accounting": _sum_accounting(as2d_rows),
        "records": records,
    }


def _sum_accounting(rows: list[dict]) -> dict[str, float]:
    keys = ("total_s", "producer_s", "verifier_s", "overlap_s", "residual_s")
    totals = {k: round(sum(r["accounting"][k] for r in rows), 4) for k in keys} if rows else {}
    if rows:
        widths = [w for r in rows for w in r["call_widths"]]
        totals.update(
            k1_share=round(widths.count(1) / len(widths), 3),
            coverage=round(sum(r["accepted"] for r in rows) / sum(r["n_tokens"] for r in rows), 3),
            published=sum(r["published"] for r in rows),
            used=sum(r["used"] for r in rows),
            accepted=sum(r["accepted"] for r in rows),
        )
    return totals


def print_report(report: dict[str, Any]) -> None:
    header = f"{'dataset':14s} {'method':8s} {'win':>4s} {'equal':>5s} {'TPS':>7s} "
    header += f"{'x target':>8s} {'x serial':>8s} {'slower':>7s}"
    print(header)
    print("-" * len(header))
    for dataset, figures in [*report["datasets"].items(), ("pooled", report["methods"])]:
        for method, f in figures.items():
            print(
                f"{dataset:14s} {method:8s} {f['windows']:4d} {f['equal_windows']:5d} {f['pooled_tps']:7.2f} "
                f"{f['ratio_to_target'] or 0:8.2f} {f['ratio_to_best_serial'] or 0:8.2f} "
                f"{(f['slower_than_target_fraction'] or 0) * 100:6.1f}%"
            )
    for method, f in report["methods"].items():
        if f["mismatched_windows"]:
            print(f"{method}: {f['mismatched_windows']} window(s) differing from target-only left out of its figures")
    if report["as2d_accounting"]:
        a = report["as2d_accounting"]
        print(
            f"as2d stages (summed): T {a['total_s']:.2f} s = D {a['producer_s']:.2f} + V {a['verifier_s']:.2f} "
            f"- O {a['overlap_s']:.2f} + H {a['residual_s']:.2f}; K=1 calls {a['k1_share'] * 100:.0f}%, "
            f"coverage {a['coverage'] * 100:.0f}%, candidates published {a['published']}, used {a['used']}, "
            f"accepted {a['accepted']}"
        )
    if report.get("oracle"):
        print_oracle(report["oracle"])
    print(f"machine: {report['cores']} cores, load average {report['load_average'][0]:.2f}")


def print_oracle(oracle: dict[str, Any]) -> None:
    deployed = oracle["deployed"]
    print(
        f"oracle (replay, {oracle['catalog']['producers']} x budgets {oracle['catalog']['budgets']}): "
        f"deployed {deployed['producer']} budget {deployed['budget']} ({oracle['selected_by']})"
    )
    for dataset, f in [*oracle["datasets"].items(), ("pooled", oracle)]:
        print(
            f"  {dataset:14s} oracle {f['pooled_tps']:7.2f} tok/s, deployed {f['deployed_pooled_tps']:7.2f} "
            f"= {100 * f['deployed_ratio']:.1f}% of oracle (gap {f['gap_pct']:.2f}%)"
        )
    print(
        f"  native deployed As²d {oracle['native_deployed_pooled_tps']:.2f} tok/s = "
        f"{100 * oracle['native_deployed_ratio']:.1f}% of the replayed oracle"
    )


def plot_cdf(records: list[dict], methods: list[str], path: Path) -> None:
    from asyncspec.plots import plt, save, step_cdf

    figure, axis = plt.subplots(figsize=(7, 4))
    for method in methods:
        step_cdf(
            axis, [r["tps"] for r in records if r["method"] == method and r.get("equal_to_target") is not False], method
        )
    axis.set_xlabel("tokens / s per window (after prefill)")
    axis.set_ylabel("fraction of windows")
    axis.set_title("per-window throughput (farther right is faster)")
    axis.legend()
    save(figure, path)


def plot_timeline(records: list[dict], path: Path) -> None:
    """The longest As²d window: producer work (chunks) and target calls on one time axis."""
    from asyncspec.plots import plt, save

    rows = [r for r in records if r["method"] == "as2d"]
    if not rows:
        return
    record = max(rows, key=lambda r: r["seconds"])
    figure, axis = plt.subplots(figsize=(10, 2.8))
    producer = [(a, b - a) for a, b in record["producer_intervals"]]
    calls = list(zip(record["call_intervals"], record["call_widths"], strict=True))
    wide = [(a, b - a) for (a, b), width in calls if width > 1]
    single = [(a, b - a) for (a, b), width in calls if width == 1]
    edges: dict[str, Any] = {"edgecolor": "white", "linewidth": 0.4}
    axis.broken_barh(producer, (1.1, 0.8), color="#e07b39", label="producer: a chunk recognised + published", **edges)
    axis.broken_barh(wide, (0.1, 0.8), color="#1f5fa8", label="target: verify ready candidates (K > 1)", **edges)
    axis.broken_barh(single, (0.1, 0.8), color="#9cc3ea", label="target: one-token step (K = 1)", **edges)
    axis.axvline(record["decode_s"], color="#333", linestyle="--", linewidth=1)
    axis.set_yticks([0.5, 1.5], ["target", "producer"])
    axis.set_xlabel("seconds after prefill")
    axis.set_title(f"As²d on window {record['window']} ({record['seconds']} s audio, {record['n_tokens']} tokens)")
    axis.legend(loc="upper right", fontsize=8)
    save(figure, path)
