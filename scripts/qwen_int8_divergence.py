"""Where int8 and bf16 greedy decoding part, what each precision (and fp32) sees there.

For every problem of a `measure_qwen_int8_quality.py` result whose int8 and bf16 token sequences differ,
the prompt plus their common prefix is prefilled once per dtype (the fixed-shape engine's logits do not
depend on how the tokens were fed, so these are the logits decoding saw), and at the first divergence
this records each dtype's two highest logits (their gap: how near a tie the choice was) and which of the
two continuations fp32 would take. The dtype's own pick is checked against its decoded token. bf16
logits carry an 8-bit mantissa, so exact ties occur; argmax breaks them by the lower token id.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python scripts/qwen_int8_divergence.py \\
        docs/results/qwen_int8_quality_gsm8k_0.5b_2026-12-03.json --out docs/results/....json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from asyncspec.benchmarks.greedy_agreement import first_divergence
from asyncspec.data.workloads.tasks import Task, load_tasks
from asyncspec.models.base import DecodeRequest
from asyncspec.models.registry import load_decoder

DTYPES = ("int8", "bf16", "fp32")


def margins(target, prompt_ids: tuple[int, ...]) -> dict:
    """The greedy pick after `prompt_ids` (argmax: the lowest id wins an exact tie), the top two
    tokens and the gap between their logits (0: an exact tie)."""
    logits = target.prefill(DecodeRequest(prompt_ids, max_new_tokens=1)).next_logits.float()
    top = torch.topk(logits, 2)
    gap = float(top.values[0] - top.values[1])
    return {"pick": target.greedy(logits)[0], "top": top.indices.tolist(), "gap": round(gap, 4)}


def divergence_record(targets: dict, task: Task, problem: dict) -> dict | None:
    int8, bf16 = problem["int8"]["tokens"], problem["bf16"]["tokens"]
    k = first_divergence(bf16, int8)
    if k is None or k >= min(len(int8), len(bf16)):
        return None  # identical, or one stopped where the other went on
    prompt = targets["bf16"].request(task.prompt).prompt_ids + tuple(bf16[:k])
    record: dict = {"task_id": task.task_id, "position": k, "int8_token": int8[k], "bf16_token": bf16[k]}
    for dtype, target in targets.items():
        record[dtype] = margins(target, prompt)
    record["self_consistent"] = record["int8"]["pick"] == int8[k] and record["bf16"]["pick"] == bf16[k]
    fp32 = record["fp32"]["pick"]
    record["fp32_sides_with"] = "int8" if fp32 == int8[k] else "bf16" if fp32 == bf16[k] else "neither"
    return record


def summary(records: list[dict]) -> dict:
    """How often fp32 takes each side, how many bf16 picks were exact ties, the median gaps."""
    sides = [r["fp32_sides_with"] for r in records]

    def median_gap(dtype: str) -> float | None:
        gaps = sorted(r[dtype]["gap"] for r in records)
        return gaps[len(gaps) // 2] if gaps else None

    return {
        "divergences": len(records),
        "fp32_sides_with": {side: sides.count(side) for side in ("int8", "bf16", "neither")},
        "bf16_exact_ties": sum(r["bf16"]["gap"] == 0 for r in records),
        "int8_exact_ties": sum(r["int8"]["gap"] == 0 for r in records),
        "median_gap": {dtype: median_gap(dtype) for dtype in DTYPES},
        "self_consistent": sum(r["self_consistent"] for r in records),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs = [json.loads(path.read_text()) for path in args.results]
    targets = {dtype: load_decoder(runs[0]["model"], dtype) for dtype in DTYPES}
    records = []
    for run in runs:
        tasks = {t.task_id: t for w in ("humaneval", "gsm8k") for t in load_tasks(w)}
        for problem in run["problems"]:
            found = divergence_record(targets, tasks[problem["task_id"]], problem)
            if found is not None:
                records.append(found)
                body = {"model": runs[0]["model"], "summary": summary(records), "divergences": records}
                args.out.write_text(json.dumps(body, indent=1) + "\n")
                print(json.dumps(found), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
