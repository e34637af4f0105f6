"""The correction-sensitivity measures on synthetic distributions: the certificate bounds the residual
TV, both shrink as K grows, the full support is exact."""

from __future__ import annotations

import torch

from asyncspec.benchmarks.correction_sensitivity import fidelity_at


def test_certificate_bounds_residual_tv_and_full_support_is_exact():
    generator = torch.Generator().manual_seed(0)
    vocab = 200
    for _ in range(20):
        p = torch.softmax(3 * torch.randn(vocab, generator=generator), 0)
        q = torch.softmax(3 * torch.randn(vocab, generator=generator), 0)
        found = fidelity_at(p, q, [4, 16, 64, vocab])
        assert found is not None
        tvs = [found[k]["residual_tv"] for k in (4, 16, 64, vocab)]
        assert all(a >= b - 1e-12 for a, b in zip(tvs, tvs[1:], strict=False))  # more support, closer residual
        for k in (4, 16, 64):
            assert found[k]["residual_tv"] <= found[k]["certificate"] + 1e-6
        assert found[vocab]["residual_tv"] < 1e-9 and found[vocab]["top10_recall"] == 1.0
        assert found[vocab]["tail_mass"] < 1e-9


def test_no_residual_when_the_draft_matches():
    p = torch.softmax(torch.randn(50), 0)
    assert fidelity_at(p, p.clone(), [4]) is None


def test_quality_record_scores_gsm8k_completions():
    from asyncspec.benchmarks.correction_sensitivity import quality_record
    from asyncspec.data.workloads.tasks import load_tasks

    tasks = load_tasks("gsm8k", limit=2)
    texts = [(f"so the answer is \\boxed{{{tasks[0].reference}}}", {"corrections": {"full": 1}}), ("\\boxed{-1}", {})]
    record = quality_record(tasks, texts, 1.0)
    assert record["correct"] == [True, False] and record["accuracy"] == 0.5
    assert record["corrections"] == [{"full": 1}, {}]
