"""Run several methods on the same request, check them against target-only, print the verdict."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.exactness import ExactnessCheck
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.run.report import emit, write_json
from asyncspec.run.summary import REFERENCE, comparison_records, format_table, summarize

NEEDS_DRAFTER = {"sd", "specasr"}


def methods_to_run(methods: Sequence[str], compare: bool) -> list[str]:
    """With --compare, target-only runs first so every other method is checked against it."""
    return [REFERENCE] + [m for m in methods if m != REFERENCE] if compare else list(methods)


def needs_drafter(methods: Sequence[str]) -> bool:
    return any(method in NEEDS_DRAFTER for method in methods)


def decode_request(
    target: Decoder, drafters: dict[str, Any], request: DecodeRequest, methods: Sequence[str], config: DecodeConfig
) -> list[DecodeResult]:
    """Each method with its own drafter (a prefix-conditioned model, or As²d's producer)."""
    return [METHODS[method](target, drafters.get(method), request, config) for method in methods]


def describe_window(context: dict[str, Any]) -> str:
    """How a mismatch names the input: the file's window, or the prompt."""
    if "where" in context:
        return context["where"]
    if "file" in context:
        return f"{context['file']} window {context.get('window', 0)}"
    return str(context.get("prompt", context))


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
    methods: Sequence[str],
    config: DecodeConfig,
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
            emit(record)
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


def print_summary(
    records: list[dict[str, Any]], exactness: ExactnessCheck | None = None, json_path: str | None = None, **extra: Any
) -> int:
    """The side-by-side table (several methods), the exactness verdict and, with `json_path`, the
    records, summary, verdict and `extra` as JSON. The exit code: 1 when any output differs from
    target-only or nothing was compared, else 0."""
    summary = summarize(records)
    if len(summary) > 1:
        print(format_table(summary))
    exit_code = exactness.report() if exactness is not None else 0
    if json_path:
        verdict = exactness.as_json() if exactness is not None else None
        write_json(json_path, {"records": records, "summary": summary, **extra, "exactness": verdict})
    return exit_code
