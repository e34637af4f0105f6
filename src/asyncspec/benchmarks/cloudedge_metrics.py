"""Figures of one cloud–edge run, with their 95 % intervals over the run's requests.

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

import numpy as np

from asyncspec.benchmarks.cloudedge_driver import RunOutput

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
