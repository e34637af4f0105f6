"""Run several methods on the same request, check them against target-only, summarise side by side."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from asyncspec.commands.report import emit, result_record
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.exactness import ExactnessCheck
from asyncspec.models.base import Decoder, DecodeRequest

REFERENCE = "target"
NEEDS_DRAFTER = {"sd", "specasr"}


def methods_to_run(methods: list[str], compare: bool) -> list[str]:
    """With --compare, target-only runs first so every other method is checked against it."""
    return [REFERENCE] + [m for m in methods if m != REFERENCE] if compare else methods


def needs_drafter(methods: list[str]) -> bool:
    return any(method in NEEDS_DRAFTER for method in methods)


def decode_request(
    target: Decoder, drafters: dict[str, Any], request: DecodeRequest, methods: list[str], config: DecodeConfig
) -> list[DecodeResult]:
    """Each method with its own drafter (a prefix-conditioned model, or As²d's producer)."""
    return [METHODS[method](target, drafters.get(method), request, config) for method in methods]


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


def describe_window(context: dict[str, Any]) -> str:
    """How a mismatch names the input: the file's window, or the prompt."""
    if "where" in context:
        return context["where"]
    if "file" in context:
        return f"{context['file']} window {context.get('window', 0)}"
    return str(context.get("prompt", context))


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


def save_traces(path: str | Path, results: list[tuple[dict[str, Any], DecodeResult]]) -> None:
    """Every decode's stage events and stats, to be replayed later."""
    payload = [
        {
            "context": context,
            "method": result.method,
            "tokens": result.tokens,
            "stats": asdict(result.stats),
            **result.trace.to_json(),
        }
        for context, result in results
    ]
    Path(path).write_text(json.dumps(payload))


def run_jobs(
    target: Decoder,
    drafters: dict[str, Any],
    jobs: Iterable[tuple[dict[str, Any], DecodeRequest]],
    methods: list[str],
    config: DecodeConfig,
    as_json: bool,
    trace_path: str | None = None,
    exactness: ExactnessCheck | None = None,
) -> list[dict[str, Any]]:
    """Decode every (context, request) job with every method; print records as they finish.
    With `exactness`, every method's output is checked against target-only's on the same job."""
    records, traced = [], []
    for context, request in jobs:
        results = decode_request(target, drafters, request, methods, config)
        if exactness is not None:
            check_against_reference(exactness, describe_window(context), request, results)
        for record in comparison_records(results, target, exactness is not None, **context):
            emit(record, as_json)
            records.append(record)
        traced += [(context, result) for result in results]
    if trace_path:
        save_traces(trace_path, traced)
    return records


def equality_check(target: Decoder, config: DecodeConfig, compare: bool) -> ExactnessCheck | None:
    """The check of a run compared with target-only; None without comparison, or when sampling
    (sampled outputs follow the target's law, they are not its tokens)."""
    if not compare:
        return None
    if config.temperature > 0:
        print("note: sampled outputs (--temperature > 0) are not compared token for token", file=sys.stderr)
        return None
    return ExactnessCheck(target)


def check_against_reference(
    exactness: ExactnessCheck, where: str, request: DecodeRequest, results: list[DecodeResult]
) -> None:
    reference = next(r for r in results if r.method == REFERENCE)
    for result in results:
        if result is not reference:
            exactness.check(where, result.method, request, reference.tokens, result.tokens)


def print_summary(records: list[dict[str, Any]], as_json: bool, exactness: ExactnessCheck | None = None) -> int:
    """The side-by-side table (human output, several methods) and the exactness verdict; the exit
    code: 1 when any output differs from target-only or nothing was compared, else 0."""
    if not as_json and len({r["method"] for r in records}) > 1:
        print(format_table(summarize(records)))
    return exactness.report() if exactness is not None else 0
