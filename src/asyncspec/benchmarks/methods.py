"""`asyncspec bench methods`: target-only and the serial speculative methods side by side on a
real workload (LibriVox speech with Whisper, or HumanEval prompts with Qwen), in one run so the
ratios share machine conditions. Prints a table, writes JSON and a PNG."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncspec.benchmarks.humaneval import humaneval_prompts
from asyncspec.data.librivox import librivox_clips
from asyncspec.models.base import DecodeRequest
from asyncspec.models.hf_causal import CausalLMBackend
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.run.compare import equality_check, methods_to_run, run_jobs
from asyncspec.run.models import load_models
from asyncspec.run.options import DecodingOptions, decode_config
from asyncspec.run.summary import format_table, summarize
from asyncspec.run.windows import file_windows, window_jobs

DEFAULT_PROMPTS = 5
WORKLOADS = {
    "librivox": ("whisper-base", "whisper-tiny.en"),
    "humaneval": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"),
}


def humaneval_jobs(
    target: CausalLMBackend, n: int, max_new_tokens: int
) -> Iterator[tuple[dict[str, Any], DecodeRequest]]:
    for index, prompt in enumerate(humaneval_prompts(n)):
        yield {"prompt": f"HumanEval/{index}", "window": 0}, target.request(prompt, max_new_tokens=max_new_tokens)


def run(args) -> int:
    default_model, default_drafter = WORKLOADS[args.workload]
    options = DecodingOptions.from_args(args)
    options = replace(
        options,
        model=options.model or default_model,
        drafter=options.drafter or default_drafter,
        methods=tuple(methods_to_run(options.methods, compare=True)),
    )
    config = decode_config(options)
    speech = args.workload == "librivox"
    windows = file_windows([str(clip.path) for clip in librivox_clips()][: args.n]) if speech else []
    kind: type[Any] = WhisperBackend if speech else CausalLMBackend
    with load_models(options, kind, "speech" if speech else "text") as (target, drafters):
        if speech:
            jobs = window_jobs(target, windows)
        else:
            jobs = humaneval_jobs(target, args.n or DEFAULT_PROMPTS, args.max_new_tokens)
        exactness = equality_check(target, config, compare=True)
        records = run_jobs(target, drafters, jobs, options.methods, config, exactness=exactness)
    summary = summarize(records)
    print(format_table(summary))
    load = os.getloadavg()[0]
    models = f"{options.model} <- {options.drafter}, {options.dtype}"
    print(f"machine: {os.cpu_count()} cores, load average {load:.2f}; {models}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "workload": args.workload,
        "model": options.model,
        "drafter": options.drafter,
        "dtype": options.dtype,
        "budget": options.budget,
        "as2d": options.as2d_record(),
        "load_average": os.getloadavg()[0],
        "summary": summary,
        "exactness": exactness.as_json() if exactness else None,
        "records": records,
    }
    (out / f"methods_{args.workload}.json").write_text(json.dumps(report, indent=1))
    plot_methods(
        records, summary, out / f"methods_{args.workload}.png", f"{args.workload}: {options.model} <- {options.drafter}"
    )
    print(f"wrote {out / f'methods_{args.workload}.json'} and .png")
    return exactness.report() if exactness else 0


def plot_methods(records: list[dict], summary: dict[str, dict], path: Path, title: str) -> None:
    """Left: pooled TPS per method; right: per-window TPS ratio to target-only."""
    from asyncspec.plots import plt, save

    methods = list(summary)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(
        methods, [summary[m]["tps"] for m in methods], color=["#888", "#4a90d9", "#e07b39", "#3a9d5d"][: len(methods)]
    )
    left.set_ylabel("pooled tokens / s (after prefill)")
    left.set_title("throughput")
    reference = {(r.get("file", r.get("prompt")), r["window"]): r["tps"] for r in records if r["method"] == "target"}
    for method in methods[1:]:
        ratios = [
            r["tps"] / reference[(r.get("file", r.get("prompt")), r["window"])]
            for r in records
            if r["method"] == method
            and r.get("equal_to_target") is not False  # a mismatched window is no speed-up
            and reference.get((r.get("file", r.get("prompt")), r["window"]))
        ]
        right.plot(sorted(ratios), marker="o", label=method)
    right.axhline(1.0, color="#888", linestyle="--", linewidth=1)
    right.set_ylabel("TPS / target-only TPS")
    right.set_xlabel("windows, sorted")
    right.set_title("per-window speed-up")
    right.legend()
    figure.suptitle(title)
    save(figure, path)
