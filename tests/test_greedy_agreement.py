import pytest

from asyncspec.benchmarks.greedy_agreement import agreement, common_prefix, first_divergence


def test_common_prefix_and_divergence():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([5], [6]) == 0
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # one ended where the other went on
    assert first_divergence([], [7]) == 0


def test_agreement_summary():
    reference = [[1, 2, 3, 4], [1, 2, 3, 4], [9, 9], [1, 2]]
    other = [[1, 2, 3, 4], [1, 2, 0, 0], [8], [1, 2, 3]]
    summary = agreement(reference, other)
    assert summary["common_prefix"] == [4, 2, 0, 2]
    assert summary["first_divergence"] == [None, 2, 0, 2]
    assert summary["identical"] == 1
    assert summary["identical_fraction"] == 0.25
    assert summary["mean_common_prefix"] == 2.0
    assert summary["mean_first_divergence"] == pytest.approx(4 / 3)
    assert summary["mean_reference_fraction_kept"] == pytest.approx((1 + 0.5 + 0 + 1) / 4)


def test_agreement_needs_paired_sequences():
    with pytest.raises(ValueError):
        agreement([[1]], [[1], [2]])


def _script(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quality_summary_and_table(tmp_path):
    """The per-workload summary of a run: scores, agreement with the reference, verdicts that differ."""
    import json

    measure = _script("measure_qwen_int8_quality")

    def run(tokens, text, correct):
        return {"tokens": tokens, "text": text, "finish": "eos", "seconds": 1.0, "correct": correct, "detail": ""}

    problems = [
        {"task_id": "gsm8k/0", "workload": "gsm8k", "int8": run([1, 2], "a", True), "bf16": run([1, 2], "a", True)},
        {"task_id": "gsm8k/1", "workload": "gsm8k", "int8": run([1, 3], "b", False), "bf16": run([1, 2], "c", True)},
    ]
    found = measure.summary(problems, ["int8", "bf16"], "bf16")["gsm8k"]
    assert found["bf16"]["accuracy"] == 1.0 and found["int8"]["accuracy"] == 0.5
    assert found["int8"]["agreement_with_bf16"]["identical"] == 1
    assert found["int8"]["agreement_with_bf16"]["mean_first_divergence"] == 1.0
    assert found["int8"]["verdict_differs_from_bf16"] == 1
    assert found["int8"]["scored_text_identical_to_bf16"] == 1
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"dtypes": ["int8", "bf16"], "reference": "bf16", "problems": problems}))
    table = measure.table([path])
    assert "| gsm8k | int8 | 2 | 1/2 (50.0%) | 1/2 | 1.5 | 1.0 | 1/2 | 1 |" in table


def test_divergence_summary():
    divergence = _script("qwen_int8_divergence")

    def at(pick, gap):
        return {"pick": pick, "top": [pick, 0], "gap": gap}

    records = [
        {"int8": at(5, 0.1), "bf16": at(6, 0.0), "fp32": at(5, 0.02), "fp32_sides_with": "int8", "self_consistent": 1},
        {"int8": at(5, 0.3), "bf16": at(6, 0.5), "fp32": at(6, 0.2), "fp32_sides_with": "bf16", "self_consistent": 1},
    ]
    found = divergence.summary(records)
    assert found["fp32_sides_with"] == {"int8": 1, "bf16": 1, "neither": 0}
    assert found["bf16_exact_ties"] == 1 and found["int8_exact_ties"] == 0
    assert found["median_gap"]["bf16"] == 0.5
