"""Re-measure the CPU side of the link-scale derivation (asyncspec.cloudedge.link.profiles).

Times one block verification of the cloud target (Qwen2.5-Coder-1.5B, bf16, one torch thread): a width-K
`extend` after a HumanEval prompt, rolled back after each call, and prints the factor
S = T_verify(CPU) / T_verify(A100) against the published A100 figures. Run it on a quiet machine:

    PYTHONPATH=src python scripts/measure_verify_cpu.py --widths 1 8 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from asyncspec.cloudedge.link.profiles import GPU_VERIFY_S_1P5B_A100, GPU_VERIFY_S_32B_A100
from asyncspec.data.workloads.tasks import humaneval_tasks
from asyncspec.models.hf_causal import CausalLMBackend
from asyncspec.models.registry import load_decoder


def time_block(target, state, width: int, repeats: int) -> list[float]:
    """Seconds per width-`width` verification call; the state is rolled back after each one."""
    base = state.length
    block = (state.tokens * width)[:width]  # any ids: the cost does not depend on which
    target.extend(state, block)  # warm-up at this width
    target.rollback(state, base)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        target.extend(state, block)
        times.append(time.perf_counter() - start)
        target.rollback(state, base)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_decoder(args.model, torch.bfloat16)
    prompt = humaneval_tasks(limit=1)[0].prompt
    assert isinstance(target, CausalLMBackend)
    state = target.prefill(target.request(prompt, max_new_tokens=64))
    results = {"model": args.model, "threads": args.threads, "prompt_tokens": state.length}
    results["loadavg_before"] = os.getloadavg()
    for width in args.widths:
        times = time_block(target, state, width, args.repeats)
        median = statistics.median(times)
        results[f"width_{width}"] = {
            "median_s": round(median, 4),
            "min_s": round(min(times), 4),
            "scale_vs_32b_a100": round(median / GPU_VERIFY_S_32B_A100, 1),
            "scale_vs_1p5b_a100": round(median / GPU_VERIFY_S_1P5B_A100, 1),
        }
    results["loadavg_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
