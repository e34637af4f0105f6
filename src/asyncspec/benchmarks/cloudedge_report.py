"""The cross-method comparisons the AsymSpec evaluation asks for (with separability from the
intervals of `cloudedge_metrics.py`), seed 002's Table II, the printed tables, and the plots."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asyncspec.benchmarks.cloudedge_metrics import overlap
from asyncspec.cloudedge.methods import BASELINES, TABLE_II_LABELS


def corrections_text(c: dict) -> str:
    """cloud/resid/exact/topK/full counts, then the round trips each mode took (modes that took any)."""
    counts = f"{c.get('cloud', 0)}/{c.get('residual', 0)}/{c['exact']}/{sum(c['topk'].values())}/{c['full']}"
    rounds = c.get("rounds", {})
    return counts + (" r" + ",".join(f"{m}:{n}" for m, n in rounds.items() if n) if any(rounds.values()) else "")


# ---------------------------------------------------------------- comparisons


def _index(results: list[dict]) -> dict[tuple, dict]:
    return {(r["link_scale"], r["profile"], r["method"], r.get("temperature")): r for r in results}


def _temperatures(results: list[dict]) -> list:
    return list(dict.fromkeys(r.get("temperature") for r in results))


def _key(scale: float, temperature) -> str:
    return f"scale {scale:g}" + ("" if temperature is None else f", T {temperature:g}")


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def comparisons(results: list[dict]) -> dict:
    """The must-show figures of the evaluation, computed from the results (None where a method did not run).
    Keys "scale S" (one temperature) or "scale S, T t"; `separable` compares AsymSpec's throughput interval
    with every other method's: True (disjoint), False (they overlap: not separable), None (no interval)."""
    at = _index(results)
    scales = sorted({r["link_scale"] for r in results})
    temperatures = _temperatures(results)
    profiles = [p for p in ("weak", "medium", "strong") if any(r["profile"] == p for r in results)]
    methods = list(dict.fromkeys(r["method"] for r in results))
    out: dict = {
        "asymspec_weak_vs_strong": {}, "asymspec_vs": {}, "separable": {}, "uplink_bytes_per_token": {},
        "block_bytes_per_token": {},
    }  # fmt: skip
    for scale in scales:
        for temperature in temperatures:
            key = _key(scale, temperature if len(temperatures) > 1 else None)

            def run(profile, method, scale=scale, temperature=temperature):
                return at.get((scale, profile, method, temperature), {})

            def thr(profile, method):
                return run(profile, method).get("throughput_tok_s")

            weak, strong = thr("weak", "asymspec"), thr("strong", "asymspec")
            out["asymspec_weak_vs_strong"][key] = _ratio(weak, strong) - 1 if _ratio(weak, strong) else None
            out["asymspec_vs"][key] = {
                profile: {m: _ratio(thr(profile, "asymspec"), thr(profile, m)) for m in BASELINES if thr(profile, m)}
                for profile in profiles
            }
            out["separable"][key] = {
                profile: {
                    m: _separable(run(profile, "asymspec"), run(profile, m))
                    for m in methods
                    if m != "asymspec" and run(profile, m)
                }
                for profile in profiles
            }
            out["uplink_bytes_per_token"][key] = {
                profile: {
                    m: run(profile, m)["uplink_bytes_per_token"] for m in ("asymspec", "standard") if run(profile, m)
                }
                for profile in profiles
            }
            out["block_bytes_per_token"][key] = {
                profile: {
                    m: (run(profile, m).get("intervals") or {}).get("block_message_bytes_per_token")
                    for m in ("asymspec", "standard")
                    if run(profile, m)
                }
                for profile in profiles
            }
    return out


def _separable(a: dict, b: dict) -> dict | None:
    """AsymSpec's run `a` against run `b`: both throughputs with their intervals, and whether they separate."""
    if not a or not b:
        return None
    ia, ib = (r.get("intervals", {}).get("request_tok_s") for r in (a, b))
    overlapping = overlap(ia, ib)
    return {
        "asymspec": a["throughput_tok_s"], "other": b["throughput_tok_s"], "asymspec_interval": ia,
        "other_interval": ib, "separable": None if overlapping is None else not overlapping,
        "asymspec_above": None if not ia or not ib else ia["mean"] > ib["mean"],
    }  # fmt: skip


def table_ii(results: list[dict]) -> dict:
    """Seed 002 Table II: per scale (and temperature), metric and configuration, the value per profile,
    its relation to Full and its 95 % interval."""
    at = _index(results)
    metrics = (
        ("throughput_tok_s", None, "Throughput tokens/s ↑"),
        ("request_tok_s_mean", "request_tok_s", "Per-request tokens/s ↑"),
        ("e2e_s_mean", "e2e_s", "E2E latency s ↓"),
        ("ttft_s_mean", "ttft_s", "TTFT s ↓"),
        ("tpot_s_mean", "tpot_s", "TPOT s ↓"),
    )
    temperatures = _temperatures(results)
    out = {}
    for scale in sorted({r["link_scale"] for r in results}):
        for temperature in temperatures:
            profiles = [p for p in ("strong", "medium", "weak") if (scale, p, "asymspec", temperature) in at]
            rows = []
            for metric, spread, label in metrics:
                for method, name in TABLE_II_LABELS.items():
                    cells = {}
                    for profile in profiles:
                        run = at.get((scale, profile, method, temperature), {})
                        value = run.get(metric)
                        full = at[(scale, profile, "asymspec", temperature)].get(metric)
                        spreads = run.get("intervals") or {}
                        cells[profile] = (value, _ratio(value, full), spreads.get(spread) if spread else None)
                    if any(v is not None for v, _, _ in cells.values()):
                        rows.append({"metric": label, "configuration": name, "cells": cells})
            out[_key(scale, temperature if len(temperatures) > 1 else None).removeprefix("scale ")] = {
                "profiles": profiles,
                "rows": rows,
            }
    return out


# ---------------------------------------------------------------- text


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def interval_text(spread: dict | None, digits: int = 3) -> str:
    if not spread:
        return "-"
    if spread["lo"] is None:
        return f"{spread['mean']:.{digits}f} [n={spread['n']}]"
    return f"{spread['mean']:.{digits}f} [{spread['lo']:.{digits}f}, {spread['hi']:.{digits}f}]"


def format_all(kept: list[dict], summary: dict, tables: dict) -> str:
    """Every table the run prints: results, intervals, comparisons, Table II."""
    intervals = "95 % intervals over requests (mean [lo, hi]; tok/s: requests x mean per-request rate)"
    parts = [format_results(kept), f"{intervals}\n{format_intervals(kept)}", format_comparisons(summary)]
    return "\n\n".join([*parts, format_table_ii(tables)]) + "\n"


def format_results(results: list[dict]) -> str:
    header = (
        f"{'scale':>5} {'T':>4} {'profile':<7} {'method':<21} {'tok/s':>7} {'e2e':>7} {'e2e95':>7} {'ttft':>7} "
        f"{'tpot':>7} {'tpot95':>7} {'upB/tok':>9} {'dnB/tok':>9} {'blkB/tok':>8} {'acc':>5} "
        f"{'cloud/resid/exact/topK/full rounds':<36} {'inval':>5} {'done':>5}"
    )
    lines = [header]
    for r in results:
        blocks = (r.get("intervals") or {}).get("block_message_bytes_per_token") or {}
        lines.append(
            f"{r['link_scale']:>5g} {_fmt(r.get('temperature'), 1):>4} {r['profile']:<7} {r['method']:<21} "
            f"{r['throughput_tok_s']:>7.3f} {_fmt(r['e2e_s_mean'], 2):>7} {_fmt(r['e2e_s_p95'], 2):>7} "
            f"{_fmt(r['ttft_s_mean'], 2):>7} {_fmt(r['tpot_s_mean']):>7} {_fmt(r['tpot_s_p95']):>7} "
            f"{_fmt(r['uplink_bytes_per_token'], 0):>9} {_fmt(r['downlink_bytes_per_token'], 0):>9} "
            f"{_fmt(blocks.get('mean'), 1):>8} {_fmt(r['acceptance'], 2):>5} "
            f"{corrections_text(r['corrections']):<36} {r['invalidated_blocks']:>5} "
            f"{r['completed']}/{r['requests']:<3}"
        )
    return "\n".join(lines)


INTERVAL_COLUMNS = (
    ("request_tok_s", "tok/s per request", 3), ("e2e_s", "e2e s", 2), ("ttft_s", "TTFT s", 2), ("tpot_s", "TPOT s", 3),
    ("uplink_message_bytes_per_token", "up msg B/tok", 1), ("block_message_bytes_per_token", "block B/tok", 1),
)  # fmt: skip


def format_intervals(results: list[dict]) -> str:
    """Every per-request figure with its 95 % interval over requests (mean [lo, hi]; module docstring)."""
    header = f"{'scale':>5} {'T':>4} {'profile':<7} {'method':<21} " + " ".join(
        f"{label:<24}" for _, label, _ in INTERVAL_COLUMNS
    )
    lines = [header]
    for r in results:
        spreads = r.get("intervals") or {}
        cells = " ".join(f"{interval_text(spreads.get(key), digits):<24}" for key, _, digits in INTERVAL_COLUMNS)
        lines.append(
            f"{r['link_scale']:>5g} {_fmt(r.get('temperature'), 1):>4} {r['profile']:<7} {r['method']:<21} {cells}"
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
    for scale, per_profile in summary.get("separable", {}).items():
        for profile, versus in per_profile.items():
            for method, c in versus.items():
                if c is None:
                    continue
                verdict = {True: "separable", False: "NOT separable (intervals overlap)", None: "no interval"}
                relation = {True: "above", False: "below", None: "?"}[c["asymspec_above"]]
                lines.append(
                    f"[{scale}] {profile}: per-request tok/s AsymSpec {interval_text(c['asymspec_interval'])} vs "
                    f"{method} {interval_text(c['other_interval'])}: AsymSpec {relation}, {verdict[c['separable']]} "
                    f"(throughput {c['asymspec']:.3f} vs {c['other']:.3f})"
                )
    for scale, per_profile in summary["uplink_bytes_per_token"].items():
        for profile, values in per_profile.items():
            text = ", ".join(f"{m} {_fmt(v, 0)} B" for m, v in values.items())
            blocks = summary.get("block_bytes_per_token", {}).get(scale, {}).get(profile, {})
            block_text = ", ".join(f"{m} {interval_text(v, 1)} B" for m, v in blocks.items())
            lines.append(
                f"[{scale}] {profile}: uplink wire bytes per committed token: {text}; "
                f"Block messages per committed token: {block_text}"
            )
    return "\n".join(lines)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:+.1f} %"


def format_table_ii(tables: dict) -> str:
    lines = []
    for scale, table in tables.items():
        profiles = table["profiles"]
        lines.append(f"Table II shape, link scale {scale} (value (relative to Full) [95 % interval])")
        lines.append(f"{'metric':<22} {'configuration':<34} " + " ".join(f"{p:>36}" for p in profiles))
        for row in table["rows"]:
            cells = []
            for profile in profiles:
                value, relative, spread = row["cells"][profile]
                rel = (
                    "-"
                    if relative is None
                    else (f"{100 * relative:.1f}%" if "Throughput" in row["metric"] else f"{relative:.2f}x")
                )
                bounds = "" if not spread or spread["lo"] is None else f" [{spread['lo']:.2f}, {spread['hi']:.2f}]"
                cells.append(f"{_fmt(value):>8} ({rel:>6}){bounds}")
            lines.append(f"{row['metric']:<22} {row['configuration']:<34} " + " ".join(f"{c:>36}" for c in cells))
    return "\n".join(lines)


# ---------------------------------------------------------------- plots


def plot(results: list[dict], out: Path) -> list[Path]:
    """The throughput bars and latency CDFs, per temperature (the first under the plain names, others with
    a `_T<t>` suffix)."""
    paths = []
    for i, temperature in enumerate(_temperatures(results)):
        suffix = "" if i == 0 else f"_T{temperature:g}"
        paths += _plot([r for r in results if r.get("temperature") == temperature], out, suffix)
    return paths


def _plot(results: list[dict], out: Path, suffix: str) -> list[Path]:
    from asyncspec.plots import plt, step_cdf

    scales = sorted({r["link_scale"] for r in results})
    profiles = [p for p in ("weak", "medium", "strong") if any(r["profile"] == p for r in results)]
    methods = list(dict.fromkeys(r["method"] for r in results))
    at = {(r["link_scale"], r["profile"], r["method"]): r for r in results}
    figure, axes = plt.subplots(1, len(scales), figsize=(6 * len(scales), 4), squeeze=False)
    width = 0.8 / max(len(methods), 1)
    for ax, scale in zip(axes[0], scales, strict=True):
        for i, method in enumerate(methods):
            runs = [at.get((scale, p, method), {}) for p in profiles]
            x = np.arange(len(profiles)) + i * width
            ax.bar(x, [r.get("throughput_tok_s", 0.0) for r in runs], width, label=method)
        ax.set_xticks(np.arange(len(profiles)) + 0.4 - width / 2, profiles)
        ax.set_title(f"output-token throughput, link scale {scale:g}")
        ax.set_ylabel("tokens/s")
    throughput = _save(figure, axes, out / f"cloudedge_throughput{suffix}.png")

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
    cdf = _save(figure, axes, out / f"cloudedge_latency_cdf{suffix}.png")
    return [throughput, cdf]


def _save(figure, axes, path: Path) -> Path:
    from asyncspec.plots import save

    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never over a bar
    return save(figure, path)
