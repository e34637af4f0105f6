"""Figures of one cloud–edge run (throughput, latency, bytes, correction modes, invalidated work), the
cross-method comparisons the AsymSpec evaluation asks for, the table, and the plots."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from asyncspec.benchmarks.cloudedge_driver import RunOutput
from asyncspec.cloudedge.methods import BASELINES, TABLE_II_LABELS

# per-request statistics summed over a run's completed requests (the edge's own counters span runs)
SUMMED = ("invalidated_blocks", "invalidated_tokens", "invalidated_uplink_bytes", "promoted_blocks", "resyncs")


def _mean_p95(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(np.mean(values)), float(np.percentile(values, 95))


def run_metrics(output: RunOutput) -> dict:
    """Client-side timing (send -> each token -> completion) and the edge's per-request statistics."""
    records = output.records
    tokens = sum(len(r.token_times) for r in records)
    completed = [r for r in records if r.done is not None and r.error is None]
    last = max([r.token_times[-1] for r in records if r.token_times] + [output.started])
    makespan = (output.ended if output.timed_out else last) - output.started
    e2e = [r.done - r.sent for r in completed]
    ttft = [r.token_times[0] - r.sent for r in records if r.token_times]
    tpot = [
        (r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) for r in records if len(r.token_times) > 1
    ]
    stats = [r.stats for r in completed]
    drafted, accepted = sum(s.get("drafted", 0) for s in stats), sum(s.get("accepted", 0) for s in stats)
    link = output.link
    up_wire = link.up.bytes_delivered if link else None
    down_wire = link.down.bytes_delivered if link else None
    metrics = {
        "requests": len(records),
        "completed": len(completed),
        "failed": sum(1 for r in records if r.error),
        "timed_out": output.timed_out,
        "committed_tokens": tokens,
        "makespan_s": makespan,
        "throughput_tok_s": tokens / makespan if makespan > 0 else 0.0,
        "uplink_bytes_per_token": up_wire / tokens if tokens and up_wire is not None else None,
        "downlink_bytes_per_token": down_wire / tokens if tokens and down_wire is not None else None,
        "uplink_wire_bytes": up_wire,
        "downlink_wire_bytes": down_wire,
        "uplink_message_bytes": sum(s.get("uplink_bytes", 0) for s in stats),
        "downlink_message_bytes": sum(s.get("downlink_bytes", 0) for s in stats),
        "acceptance": accepted / drafted if drafted else None,
        "drafted": drafted,
        "accepted": accepted,
        "corrections": _corrections(stats),
        **{key: sum(s.get(key, 0) for s in stats) for key in SUMMED},
        "max_open_blocks_per_request": max([s.get("max_open_blocks", 0) for s in stats], default=0),
        "e2e_s": e2e,
        "errors": sorted({r.error for r in records if r.error}),
    }
    for name, values in (("e2e", e2e), ("ttft", ttft), ("tpot", tpot)):
        metrics[f"{name}_s_mean"], metrics[f"{name}_s_p95"] = _mean_p95(values)
    return metrics


def _corrections(stats: list[dict]) -> dict:
    topk: Counter = Counter()
    out = {"exact": 0, "full": 0, "queries": 0, "eps_charged": 0.0}
    for s in stats:
        modes = s.get("corrections", {})
        topk.update({int(k): n for k, n in modes.get("topk", {}).items()})
        for key in out:
            out[key] += modes.get(key, 0)
    return {"topk": {str(k): n for k, n in sorted(topk.items())}, **out}


# ---------------------------------------------------------------- comparisons


def _index(results: list[dict]) -> dict[tuple, dict]:
    return {(r["link_scale"], r["profile"], r["method"]): r for r in results}


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def comparisons(results: list[dict]) -> dict:
    """The must-show figures of the evaluation, computed from the results (None where a method did not run)."""
    at = _index(results)
    scales = sorted({r["link_scale"] for r in results})
    profiles = [p for p in ("weak", "medium", "strong") if any(r["profile"] == p for r in results)]
    out: dict = {"asymspec_weak_vs_strong": {}, "asymspec_vs": {}, "uplink_bytes_per_token": {}}
    for scale in scales:
        key = f"scale {scale:g}"

        def thr(profile, method, scale=scale):
            return at.get((scale, profile, method), {}).get("throughput_tok_s")

        weak, strong = thr("weak", "asymspec"), thr("strong", "asymspec")
        out["asymspec_weak_vs_strong"][key] = _ratio(weak, strong) - 1 if _ratio(weak, strong) else None
        out["asymspec_vs"][key] = {
            profile: {m: _ratio(thr(profile, "asymspec"), thr(profile, m)) for m in BASELINES if thr(profile, m)}
            for profile in profiles
        }
        out["uplink_bytes_per_token"][key] = {
            profile: {
                m: at[(scale, profile, m)]["uplink_bytes_per_token"]
                for m in ("asymspec", "standard")
                if (scale, profile, m) in at
            }
            for profile in profiles
        }
    return out


def table_ii(results: list[dict]) -> dict:
    """Seed 002 Table II: per scale, metric and configuration, the value per profile and its relation to Full."""
    at = _index(results)
    metrics = (
        ("throughput_tok_s", "Throughput tokens/s ↑"),
        ("e2e_s_mean", "E2E latency s ↓"),
        ("ttft_s_mean", "TTFT s ↓"),
        ("tpot_s_mean", "TPOT s ↓"),
    )
    out = {}
    for scale in sorted({r["link_scale"] for r in results}):
        profiles = [p for p in ("strong", "medium", "weak") if (scale, p, "asymspec") in at]
        rows = []
        for metric, label in metrics:
            for method, name in TABLE_II_LABELS.items():
                cells = {}
                for profile in profiles:
                    value = at.get((scale, profile, method), {}).get(metric)
                    full = at[(scale, profile, "asymspec")].get(metric)
                    cells[profile] = (value, _ratio(value, full))
                if any(v is not None for v, _ in cells.values()):
                    rows.append({"metric": label, "configuration": name, "cells": cells})
        out[f"{scale:g}"] = {"profiles": profiles, "rows": rows}
    return out


# ---------------------------------------------------------------- text


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_results(results: list[dict]) -> str:
    header = (
        f"{'scale':>5} {'profile':<7} {'method':<21} {'tok/s':>7} {'e2e':>7} {'e2e95':>7} {'ttft':>7} {'tpot':>7} "
        f"{'tpot95':>7} {'upB/tok':>9} {'dnB/tok':>9} {'acc':>5} {'topK/exact/full':>16} {'inval':>5} {'done':>5}"
    )
    lines = [header]
    for r in results:
        c = r["corrections"]
        modes = f"{sum(c['topk'].values())}/{c['exact']}/{c['full']}"
        lines.append(
            f"{r['link_scale']:>5g} {r['profile']:<7} {r['method']:<21} {r['throughput_tok_s']:>7.3f} "
            f"{_fmt(r['e2e_s_mean'], 2):>7} {_fmt(r['e2e_s_p95'], 2):>7} {_fmt(r['ttft_s_mean'], 2):>7} "
            f"{_fmt(r['tpot_s_mean']):>7} {_fmt(r['tpot_s_p95']):>7} {_fmt(r['uplink_bytes_per_token'], 0):>9} "
            f"{_fmt(r['downlink_bytes_per_token'], 0):>9} {_fmt(r['acceptance'], 2):>5} "
            f"{modes:>16} {r['invalidated_blocks']:>5} "
            f"{r['completed']}/{r['requests']:<3}"
        )
    return "\n".join(lines)


def format_comparisons(summary: dict) -> str:
    lines = []
    for scale, change in summary["asymspec_weak_vs_strong"].items():
        lines.append(f"[{scale}] AsymSpec throughput weak vs strong: {_pct(change)}")
    for scale, per_profile in summary["asymspec_vs"].items():
        for profile, ratios in per_profile.items():
            text = ", ".join(f"{m} {v:.2f}x" for m, v in ratios.items() if v is not None)
            lines.append(f"[{scale}] {profile}: AsymSpec throughput / baseline: {text}")
    for scale, per_profile in summary["uplink_bytes_per_token"].items():
        for profile, values in per_profile.items():
            text = ", ".join(f"{m} {_fmt(v, 0)} B" for m, v in values.items())
            lines.append(f"[{scale}] {profile}: uplink wire bytes per committed token: {text}")
    return "\n".join(lines)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:+.1f} %"


def format_table_ii(tables: dict) -> str:
    lines = []
    for scale, table in tables.items():
        profiles = table["profiles"]
        lines.append(f"Table II shape, link scale {scale} (value (relative to Full))")
        lines.append(f"{'metric':<22} {'configuration':<34} " + " ".join(f"{p:>20}" for p in profiles))
        for row in table["rows"]:
            cells = []
            for profile in profiles:
                value, relative = row["cells"][profile]
                rel = (
                    "-"
                    if relative is None
                    else (f"{100 * relative:.1f}%" if "Throughput" in row["metric"] else f"{relative:.2f}x")
                )
                cells.append(f"{_fmt(value):>11} ({rel:>6})")
            lines.append(f"{row['metric']:<22} {row['configuration']:<34} " + " ".join(f"{c:>20}" for c in cells))
    return "\n".join(lines)


# ---------------------------------------------------------------- plots


def plot(results: list[dict], out: Path) -> list[Path]:
    from asyncspec.plots import plt, step_cdf

    scales = sorted({r["link_scale"] for r in results})
    profiles = [p for p in ("weak", "medium", "strong") if any(r["profile"] == p for r in results)]
    methods = list(dict.fromkeys(r["method"] for r in results))
    at = _index(results)
    figure, axes = plt.subplots(1, len(scales), figsize=(6 * len(scales), 4), squeeze=False)
    width = 0.8 / max(len(methods), 1)
    for ax, scale in zip(axes[0], scales, strict=True):
        for i, method in enumerate(methods):
            values = [at.get((scale, p, method), {}).get("throughput_tok_s", 0.0) for p in profiles]
            ax.bar(np.arange(len(profiles)) + i * width, values, width, label=method)
        ax.set_xticks(np.arange(len(profiles)) + 0.4 - width / 2, profiles)
        ax.set_title(f"output-token throughput, link scale {scale:g}")
        ax.set_ylabel("tokens/s")
    throughput = _save(figure, axes, out / "cloudedge_throughput.png")

    figure, axes = plt.subplots(
        len(scales), len(profiles), figsize=(4 * len(profiles), 3.5 * len(scales)), squeeze=False
    )
    for row, scale in enumerate(scales):
        for col, profile in enumerate(profiles):
            ax = axes[row][col]
            for method in methods:
                step_cdf(ax, at.get((scale, profile, method), {}).get("e2e_s", []), method)
            ax.set_title(f"{profile}, scale {scale:g}")
            ax.set_xlabel("end-to-end latency (s)")
            ax.set_ylabel("CDF")
    cdf = _save(figure, axes, out / "cloudedge_latency_cdf.png")
    return [throughput, cdf]


def _save(figure, axes, path: Path) -> Path:
    from asyncspec.plots import save

    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never over a bar
    return save(figure, path)
