"""Measure the cloud's stacked batching (issue 25 §1): verification throughput with every ready
request's block in one wide call against one call per request, and check the logits are bitwise
equal.

The cloud's target (Qwen2.5-Coder-1.5B) on one torch thread; `--requests` requests, each prefilled
with a HumanEval prompt, each verifying a block of 8 rows (root + 7 candidates). One step verifies
every request's block and rolls it back: per-request (`extend` per request, 8-row calls) or stacked
(`extend_stacked`, one call of 8 x requests rows), alternating, median of `--repeats` steps. The
invariance self-test with the batch check (the cloud's gate for stacking) runs first, as `serve cloud`
asks for it, but fresh (not from the per-machine cache), so that its cost is measured too. Run it on
a quiet machine:

    PYTHONPATH=src python scripts/measure_cloud_batching.py --dtypes bf16 int8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from asyncspec.cloudedge.cloud_state import CloudConfig
from asyncspec.data.workloads.tasks import humaneval_tasks
from asyncspec.models.hf_causal import CausalLMBackend
from asyncspec.models.machine import cpu_model
from asyncspec.models.registry import load_decoder
from asyncspec.models.selftest import invariance

BLOCK_ROWS = 8  # root + 7 candidates: the edge's default block


def timed_step(target, states, blocks, stacked: bool) -> tuple[float, list[torch.Tensor]]:
    """Seconds to verify every request's block once (then rolled back), and the logits."""
    lengths = [state.length for state in states]
    start = time.perf_counter()
    if stacked:
        logits = target.extend_stacked(states, blocks, len(states))
    else:
        logits = [target.extend(state, block) for state, block in zip(states, blocks, strict=True)]
    seconds = time.perf_counter() - start
    for state, length in zip(states, lengths, strict=True):
        target.rollback(state, length)
    return seconds, logits


def measure(target, states, blocks, repeats: int) -> dict:
    """Alternating per-request and stacked steps after one warm-up of each; every step's logits
    compared bit for bit."""
    _, reference = timed_step(target, states, blocks, stacked=False)
    timed_step(target, states, blocks, stacked=True)
    times: dict[str, list[float]] = {"per_request": [], "stacked": []}
    equal = True
    for repeat in range(repeats):
        for stacked in (repeat % 2 == 0, repeat % 2 == 1):  # each mode first in half the repeats
            seconds, logits = timed_step(target, states, blocks, stacked)
            times["stacked" if stacked else "per_request"].append(seconds)
            equal = equal and all(torch.equal(a, b) for a, b in zip(logits, reference, strict=True))
    rows = len(states) * BLOCK_ROWS
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    return {
        "median_step_s": {mode: round(value, 4) for mode, value in medians.items()},
        "min_step_s": {mode: round(min(values), 4) for mode, values in times.items()},
        "rows_per_s": {mode: round(rows / value, 1) for mode, value in medians.items()},
        "stacked_over_per_request": round(medians["per_request"] / medians["stacked"], 2),
        "logits_bitwise_equal": equal,
    }


def run_dtype(model: str, dtype: str, requests: int, repeats: int) -> dict:
    started = time.perf_counter()
    target = load_decoder(model, dtype)
    assert isinstance(target, CausalLMBackend)
    loaded = time.perf_counter() - started
    report = invariance(target, use_cache=False, stacked_blocks=CloudConfig().max_stack)  # as `serve cloud`, fresh
    states = [target.prefill(target.request(task.prompt)) for task in humaneval_tasks(limit=requests)]
    blocks = [state.tokens[-BLOCK_ROWS:] for state in states]  # any ids: the cost does not depend on which
    self_test = {"summary": report.summary(), "cached": report.cached, "seconds": report.seconds}
    self_test["batch_check_seconds"] = report.stacked_seconds
    result = {"load_s": round(loaded, 1), "prompt_tokens": [state.length for state in states], "self_test": self_test}
    return result | measure(target, states, blocks, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "int8"])
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict = {"model": args.model, "requests": args.requests, "rows_per_block": BLOCK_ROWS}
    results |= {"threads": args.threads, "repeats": args.repeats, "cpu": cpu_model(), "torch": torch.__version__}
    results["loadavg_before"] = os.getloadavg()
    for dtype in args.dtypes:
        results[dtype] = run_dtype(args.model, dtype, args.requests, args.repeats)
    results["loadavg_after"] = os.getloadavg()
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
