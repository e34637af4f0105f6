"""Figures of one cloud–edge run (throughput, latency, bytes, correction modes, invalidated work), the
cross-method comparisons the AsymSpec evaluation asks for, the table, and the plots.

Intervals: every per-request figure comes with a 95 % Student-t confidence interval of its mean over the
run's requests (`intervals`): the request's rate (`request_tok_s`: its committed tokens / time from its
send to its last token, or to the end of a run cut short), end-to-end latency, TTFT, TPOT, and uplink,
downlink and Block-message bytes per committed token (the edge's message counters). The run's throughput
(committed tokens / makespan) and the wire bytes the link carried (pings and framing included) are one
figure per run: requests are not independent units of those, so they have no interval; methods are
compared on the per-request rate, and two methods are *not separable* when its intervals overlap. Every
method serves the same requests with the same seeds, so the comparison is paired by design; the overlap
rule ignores that pairing and is the conservative one."""

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


# two-sided 95 % quantiles of Student's t by degrees of freedom (larger df: the normal's 1.960)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}  # fmt: skip


def t95(df: int) -> float:
    if df < 1:
        return float("inf")
    return _T95.get(df) or next((v for k, v in sorted(_T95.items()) if k >= df), 1.960)


def interval(values: list[float], scale: float = 1.0) -> dict | None:
    """Mean and 95 % Student-t confidence interval of the mean (times `scale`); None without values.
    With one value the interval is unbounded (lo/hi None)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return None
    n, mean = len(values), float(np.mean(values))
    half = t95(n - 1) * float(np.std(values, ddof=1)) / np.sqrt(n) if n > 1 else None
    lo, hi = (mean - half, mean + half) if half is not None else (None, None)
    return {
        "mean": scale * mean,
        "lo": None if lo is None else scale * lo,
        "hi": None if hi is None else scale * hi,
        "n": n,
    }


def overlap(a: dict | None, b: dict | None) -> bool | None:
    """Do two intervals overlap (the methods are not separable)? None when either is missing or unbounded."""
    if not a or not b or None in (a["lo"], a["hi"], b["lo"], b["hi"]):
        return None
    return a["lo"] <= b["hi"] and b["lo"] <= a["hi"]


def _per_request(output: RunOutput) -> dict[str, list[float]]:
    """Each request's figures (requests that committed nothing count 0 tokens/s over the run)."""
    values: dict[str, list[float]] = {k: [] for k in PER_REQUEST}
    for r in output.records:
        end = r.token_times[-1] if r.done is not None and r.error is None and r.token_times else output.ended
        span = end - r.sent
        values["request_tok_s"].append(len(r.token_times) / span if span > 0 else 0.0)
        if r.done is not None and r.error is None:
            values["e2e_s"].append(r.done - r.sent)
            tokens = max(len(r.tokens), len(r.token_times))
            if tokens:
                for key, stat in (("uplink", "uplink_bytes"), ("downlink", "downlink_bytes"), ("block", "block_bytes")):
                    values[f"{key}_message_bytes_per_token"].append(r.stats.get(stat, 0) / tokens)
        if r.token_times:
            values["ttft_s"].append(r.token_times[0] - r.sent)
        if len(r.token_times) > 1:
            values["tpot_s"].append((r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1))
    return values


PER_REQUEST = (
    "request_tok_s", "e2e_s", "ttft_s", "tpot_s",
    "uplink_message_bytes_per_token", "downlink_message_bytes_per_token", "block_message_bytes_per_token",
)  # fmt: skip


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
    per_request = _per_request(output)
    metrics["intervals"] = {key: interval(values) for key, values in per_request.items()}
    metrics["request_tok_s_mean"] = (metrics["intervals"]["request_tok_s"] or {}).get("mean")
    metrics["per_request"] = per_request
    return metrics


def _corrections(stats: list[dict]) -> dict:
    topk: Counter = Counter()
    rounds: Counter = Counter()
    gammas: Counter = Counter()
    out = {"cloud": 0, "residual": 0, "exact": 0, "full": 0, "queries": 0, "in_verdict": 0, "eps_charged": 0.0}
    for s in stats:
        modes = s.get("corrections", {})
        topk.update({int(k): n for k, n in modes.get("topk", {}).items()})
        rounds.update(modes.get("rounds", {}))
        gammas.update({int(k): n for k, n in s.get("gammas", {}).items()})
        for key in out:
            out[key] += modes.get(key, 0)
    return {
        "topk": {str(k): n for k, n in sorted(topk.items())},
        **out,
        "rounds": dict(rounds),  # mode -> correction round trips it took in all
        "gammas": {str(k): n for k, n in sorted(gammas.items())},  # adaptive block length: size -> blocks
    }


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
