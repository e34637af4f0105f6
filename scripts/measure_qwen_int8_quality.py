"""Qwen quality in int8 against bf16 (issue #28, item 3): greedy target-only decoding with the
fixed-shape engine in each dtype, side by side, on HumanEval and GSM8K.

Per problem, every dtype decodes the same prompt greedily (`decode_target_only`, the reference every
method equals) to a stated `max_new_tokens`; the completion is scored by the project's own scorers
(`data/workloads/scoring.py`: HumanEval pass@1 in the sandbox, GSM8K exact match on the bundled test
split, chat format). Each dtype's token sequences are compared with the reference dtype's
(`benchmarks/greedy_agreement.py`). Problems alternate HumanEval / GSM8K, in task order within each, and
the JSON is rewritten after every problem, so a run stopped early still holds complete pairs.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python scripts/measure_qwen_int8_quality.py \\
        --model qwen2.5-coder-0.5b --humaneval 164 --gsm8k 100 \\
        --out docs/results/qwen_int8_quality_0.5b_2026-12-03.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from itertools import zip_longest
from pathlib import Path

import torch

from asyncspec.benchmarks.greedy_agreement import agreement
from asyncspec.data.workloads.scoring import HUMANEVAL_STOPS, Score, accuracy, humaneval_cut, score
from asyncspec.data.workloads.tasks import Task, gsm8k_tasks, humaneval_tasks
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.registry import load_decoder

WORKLOADS = ("humaneval", "gsm8k")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def environment(args) -> dict:
    import transformers

    from asyncspec.models.int8_linear import weight_range

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "int8_weight_range": weight_range(),
        "commit": commit,
        "model": args.model,
        "dtypes": args.dtypes,
        "reference": args.reference,
        "engine": "fixed-shape",
        "decoding": "greedy target-only",
        "max_new_tokens": {"humaneval": args.humaneval_tokens, "gsm8k": args.gsm8k_tokens},
        "limits": {"humaneval": args.humaneval, "gsm8k": args.gsm8k},
        "gsm8k_format": "chat",
        "humaneval_stops": HUMANEVAL_STOPS,
    }


def interleaved(humaneval: int, gsm8k: int) -> list[Task]:
    """HumanEval and GSM8K problems alternating, each in task order."""
    pairs = zip_longest(humaneval_tasks(humaneval) if humaneval else [], gsm8k_tasks(gsm8k) if gsm8k else [])
    return [task for pair in pairs for task in pair if task is not None]


def decode(target, task: Task, max_new_tokens: int) -> dict:
    start = time.time()
    result = decode_target_only(target, None, target.request(task.prompt, max_new_tokens=max_new_tokens))
    return {
        "tokens": result.tokens,
        "text": target.tokenizer.decode(result.tokens),
        "finish": result.stats.finish_reason,
        "seconds": round(time.time() - start, 2),
    }


def verdicts(task: Task, text: str, unsafe_local_exec: bool) -> dict:
    """The score of the completion (HumanEval: cut at the stop sequences) and, for HumanEval, of the
    whole continuation as the scorer takes it by default."""
    if task.workload != "humaneval":
        verdict = score(task, text, unsafe_local_exec=unsafe_local_exec)
        return {"correct": verdict.correct, "detail": verdict.detail}
    cut = score(task, humaneval_cut(text), unsafe_local_exec=unsafe_local_exec)
    raw = score(task, text, unsafe_local_exec=unsafe_local_exec)
    return {"correct": cut.correct, "detail": cut.detail, "correct_uncut": raw.correct, "detail_uncut": raw.detail}


def problem_record(targets: dict, task: Task, args) -> dict:
    limit = args.humaneval_tokens if task.workload == "humaneval" else args.gsm8k_tokens
    record: dict = {"task_id": task.task_id, "workload": task.workload}
    for dtype, target in targets.items():
        out = decode(target, task, limit)
        record[dtype] = {**out, **verdicts(task, out["text"], args.unsafe_local_exec)}
    return record


def summary(problems: list[dict], dtypes: list[str], reference: str) -> dict:
    out = {}
    for workload in WORKLOADS:
        done = [p for p in problems if p["workload"] == workload]
        if not done:
            continue
        per_dtype = {d: _dtype_summary(done, d, reference) for d in dtypes}
        out[workload] = {"problems": len(done), **per_dtype}
    return out


def _dtype_summary(done: list[dict], dtype: str, reference: str) -> dict:
    scores = [Score(p["task_id"], p[dtype]["correct"], p[dtype]["detail"]) for p in done]
    entry: dict = {
        "accuracy": accuracy(scores),
        "correct": sum(s.correct for s in scores),
        "mean_tokens": sum(len(p[dtype]["tokens"]) for p in done) / len(done),
        "hit_length_limit": sum(p[dtype]["finish"] == "length" for p in done),
        "seconds": round(sum(p[dtype]["seconds"] for p in done), 1),
    }
    if "correct_uncut" in done[0][dtype]:
        entry["accuracy_uncut"] = sum(p[dtype]["correct_uncut"] for p in done) / len(done)
    if dtype != reference:
        found = agreement([p[reference]["tokens"] for p in done], [p[dtype]["tokens"] for p in done])
        entry[f"agreement_with_{reference}"] = {k: v for k, v in found.items() if not isinstance(v, list)}
        entry[f"verdict_differs_from_{reference}"] = sum(p[dtype]["correct"] != p[reference]["correct"] for p in done)
        entry[f"scored_text_identical_to_{reference}"] = sum(_scored(p, dtype) == _scored(p, reference) for p in done)
    return entry


def _scored(problem: dict, dtype: str) -> str:
    """The text the scorer judged: HumanEval's completion cut at the stop sequences, GSM8K's whole."""
    text = problem[dtype]["text"]
    return humaneval_cut(text) if problem["workload"] == "humaneval" else text


def write(path: Path, env: dict, problems: list[dict], args) -> None:
    body = {**env, "summary": summary(problems, args.dtypes, args.reference), "problems": problems}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1) + "\n")


def table(paths: list[Path]) -> str:
    """A Markdown table of finished (or stopped) runs, one row per workload and dtype; each file's
    summary is computed again from its problems and written back."""
    columns = ["workload", "dtype", "problems", "score", "identical tokens", "mean common prefix",
               "mean first divergence", "scored text identical", "verdict differs"]  # fmt: skip
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for path in paths:
        body = json.loads(path.read_text())
        body["summary"] = summary(body["problems"], body["dtypes"], body["reference"])
        path.write_text(json.dumps(body, indent=1) + "\n")
        for workload, entry in body["summary"].items():
            for dtype in body["dtypes"]:
                rows.append(_table_row(workload, dtype, entry, body["reference"]))
    return "\n".join(rows)


def _table_row(workload: str, dtype: str, entry: dict, reference: str) -> str:
    d, n = entry[dtype], entry["problems"]
    found = d.get(f"agreement_with_{reference}")
    if found is None:
        cells = ["(reference)", "", "", "", ""]
    else:
        divergence = found["mean_first_divergence"]
        cells = [
            f"{found['identical']}/{n}",
            f"{found['mean_common_prefix']:.1f}",
            "" if divergence is None else f"{divergence:.1f}",
            f"{d[f'scored_text_identical_to_{reference}']}/{n}",
            str(d[f"verdict_differs_from_{reference}"]),
        ]
    return f"| {workload} | {dtype} | {n} | {d['correct']}/{n} ({d['accuracy']:.1%}) | " + " | ".join(cells) + " |"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtypes", default="int8,bf16", type=lambda s: s.split(","))
    parser.add_argument("--reference", default="bf16", help="the dtype every other is compared with")
    parser.add_argument("--humaneval", type=int, default=164, help="the first N HumanEval tasks (0: none)")
    parser.add_argument("--gsm8k", type=int, default=100, help="the first N GSM8K test questions (0: none)")
    parser.add_argument("--humaneval-tokens", type=int, default=384)
    parser.add_argument("--gsm8k-tokens", type=int, default=320)
    parser.add_argument("--unsafe-local-exec", action="store_true", help="score HumanEval without namespaces")
    parser.add_argument("--out", type=Path, help="the JSON written (rewritten after every problem)")
    parser.add_argument("--table", type=Path, nargs="+", help="print a Markdown table of these results, and exit")
    args = parser.parse_args(argv)
    if args.table is None and args.out is None:
        parser.error("--out is required")
    if args.reference not in args.dtypes:
        parser.error(f"--reference {args.reference} is not among --dtypes {args.dtypes}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    torch.set_num_threads(1)
    targets = {dtype: load_decoder(args.model, dtype) for dtype in args.dtypes}
    env, problems = environment(args), []
    for task in interleaved(args.humaneval, args.gsm8k):
        problems.append(problem_record(targets, task, args))
        write(args.out, env, problems, args)
        verdicts = " ".join(f"{d}={'ok' if problems[-1][d]['correct'] else '--'}" for d in args.dtypes)
        print(f"{task.task_id}: {verdicts}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
