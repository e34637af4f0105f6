"""Per-window records of a side-by-side run, and the figures pooled over them per method."""

from __future__ import annotations

from typing import Any

from asyncspec.decoding.result import DecodeResult
from asyncspec.models.base import Decoder
from asyncspec.run.report import result_record

REFERENCE = "target"


def comparison_records(
    results: list[DecodeResult], target: Decoder, compared: bool = True, **context: Any
) -> list[dict[str, Any]]:
    """One record per method; `equal_to_target` when target-only ran on the same request and the
    outputs are comparable token for token (greedy)."""
    reference = next((r.tokens for r in results if r.method == REFERENCE), None) if compared else None
    records = []
    for result in results:
        record = result_record(result, target, **context)
        stats = result.stats
        record.update(
            equal_to_target=None if reference is None else result.tokens == reference,
            acceptance=round(stats.acceptance, 4),
            mean_accepted_len=round(stats.mean_accepted_len, 3),
            drafted=stats.drafted,
            accepted=stats.accepted,
            recovered=stats.recovered,
            bonus=stats.bonus,
            recycled=stats.recycled,
            drafter_calls=stats.drafter_calls,
            draft_s=round(stats.draft_s, 4),
            convert_s=round(stats.convert_s, 4),
            call_widths=stats.call_widths,
            **stats.extra,
            position_acceptance=[
                round(a / t, 3) for a, t in zip(stats.position_accepted, stats.position_tried, strict=True)
            ],
        )
        records.append(record)
    return records


def window_key(record: dict[str, Any]) -> tuple:
    return (record.get("file", record.get("prompt")), record.get("window", 0))


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Pooled figures per method: tokens / decode time over all windows, ratios to target-only.
    A window whose output differs from target-only is never pooled (`excluded` counts them); each
    method's ratio compares it with target-only on the same windows."""
    rows: dict[str, dict[str, float]] = {}
    pooled_windows: dict[str, set] = {}
    for record in records:
        row = rows.setdefault(record["method"], _empty_row())
        row["windows"] += 1
        row["equal"] += bool(record.get("equal_to_target"))
        if record.get("equal_to_target") is False:
            row["excluded"] += 1
            continue
        pooled_windows.setdefault(record["method"], set()).add(window_key(record))
        row["tokens"] += record["n_tokens"]
        row["decode_s"] += record["decode_s"]
        row["draft_s"] += record.get("draft_s", 0.0)
        row["drafted"] += record.get("drafted", 0)
        row["accepted"] += record.get("accepted", 0)
        row["target_calls"] += record["target_calls"]
    for method, row in rows.items():
        row["tps"] = _tps(row)
        reference = _reference_tps(records, pooled_windows.get(method, set()))
        row["ratio"] = row["tps"] / reference if reference else float("nan")
        row["acceptance"] = row["accepted"] / row["drafted"] if row["drafted"] else 0.0
        row["mean_accepted_len"] = row["accepted"] / row["target_calls"] if row["drafted"] else 0.0
        row["draft_share"] = row["draft_s"] / row["decode_s"] if row["decode_s"] else 0.0
    return rows


def _empty_row() -> dict[str, float]:
    keys = ("windows", "tokens", "drafted", "accepted", "target_calls", "equal", "excluded")
    return {k: 0 for k in keys} | {"decode_s": 0.0, "draft_s": 0.0}


def _reference_tps(records: list[dict[str, Any]], windows: set) -> float:
    """Target-only's pooled TPS over the given windows."""
    rows = [r for r in records if r["method"] == REFERENCE and window_key(r) in windows]
    return _tps({"tokens": sum(r["n_tokens"] for r in rows), "decode_s": sum(r["decode_s"] for r in rows)})


def _tps(row: dict[str, float] | None) -> float:
    return row["tokens"] / row["decode_s"] if row and row["decode_s"] else 0.0


def format_table(summary: dict[str, dict[str, float]]) -> str:
    header = (
        f"{'method':10s} {'windows':>7s} {'equal':>6s} {'tokens':>7s} {'TPS':>7s} {'ratio':>6s} "
        f"{'accept':>7s} {'acc.len':>7s} {'calls':>6s} {'draft%':>7s}"
    )
    lines = [header, "-" * len(header)]
    for method, row in summary.items():
        lines.append(
            f"{method:10s} {row['windows']:7d} {row['equal']:6d} {row['tokens']:7d} {row['tps']:7.2f} "
            f"{row['ratio']:6.2f} {row['acceptance']:7.2f} {row['mean_accepted_len']:7.2f} "
            f"{row['target_calls']:6d} {row['draft_share'] * 100:6.1f}%"
        )
    lines += [
        f"{method}: {row['excluded']} window(s) differing from target-only left out of its figures"
        for method, row in summary.items()
        if row["excluded"]
    ]
    return "\n".join(lines)
