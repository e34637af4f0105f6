"""bench cloudedge's 95 % intervals over requests, the separability rule, and the figures of one run
computed from what each request saw at the client."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from asyncspec.benchmarks import cloudedge_metrics as run_figures
from asyncspec.benchmarks import cloudedge_report as report
from asyncspec.benchmarks.cloudedge_driver import RequestRecord, RunOutput


def test_t_interval_matches_the_textbook_values():
    spread = run_figures.interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182 * math.sqrt(5 / 3 / 4)  # t(0.975, 3) * s / sqrt(n), s^2 = 5/3
    assert spread["mean"] == 2.5 and spread["n"] == 4
    assert spread["lo"] == pytest.approx(2.5 - half) and spread["hi"] == pytest.approx(2.5 + half)
    assert run_figures.interval([]) is None
    assert run_figures.interval([3.0]) == {"mean": 3.0, "lo": None, "hi": None, "n": 1}  # unbounded with one request
    assert run_figures.t95(1) == 12.706 and run_figures.t95(22) == 2.060 and run_figures.t95(1000) == 1.960


def test_overlapping_intervals_are_not_separable():
    a = {"mean": 1.0, "lo": 0.8, "hi": 1.2, "n": 6}
    assert run_figures.overlap(a, {"mean": 1.3, "lo": 1.1, "hi": 1.5, "n": 6}) is True
    assert run_figures.overlap(a, {"mean": 1.5, "lo": 1.3, "hi": 1.7, "n": 6}) is False
    assert run_figures.overlap(a, {"mean": 1.5, "lo": None, "hi": None, "n": 1}) is None


def _record(index, sent, times, done=True, tokens=None, stats=None):
    record = RequestRecord(index, "p", sent, token_times=list(times))
    if done:
        record.done, record.tokens = times[-1] + 0.1, tokens or list(range(len(times)))
        record.stats = stats or {"uplink_bytes": 80 * len(times), "downlink_bytes": 10, "block_bytes": 40 * len(times)}
    return record


def test_run_metrics_give_every_figure_an_interval_over_requests():
    records = [_record(0, 0.0, [1.0, 2.0, 3.0]), _record(1, 0.0, [2.0, 3.0, 5.0]), _record(2, 0.0, [1.0], False)]
    output = RunOutput(records, 0.0, 10.0, True, SimpleNamespace(up=SimpleNamespace(bytes_delivered=700),
                                                                 down=SimpleNamespace(bytes_delivered=70)))  # fmt: skip
    metrics = run_figures.run_metrics(output)
    per_request = metrics["per_request"]
    # a request's rate: its tokens / send to last token; one cut short counts up to the run's end
    assert per_request["request_tok_s"] == pytest.approx([1.0, 0.6, 0.1])
    assert per_request["ttft_s"] == [1.0, 2.0, 1.0] and per_request["e2e_s"] == pytest.approx([3.1, 5.1])
    assert per_request["block_message_bytes_per_token"] == [40.0, 40.0]
    assert metrics["intervals"]["request_tok_s"]["n"] == 3
    assert metrics["intervals"]["e2e_s"]["mean"] == pytest.approx(4.1)
    assert metrics["throughput_tok_s"] == pytest.approx(7 / 10)  # timed out: tokens over the whole run
    assert metrics["uplink_bytes_per_token"] == pytest.approx(100)


def test_comparisons_state_separability_per_profile_and_temperature():
    def run(method, profile, temperature, rate):
        spread = {"mean": rate, "lo": rate - 0.1, "hi": rate + 0.1, "n": 6}
        return {
            "method": method, "profile": profile, "link_scale": 1.0, "temperature": temperature,
            "throughput_tok_s": rate, "uplink_bytes_per_token": 30.0, "intervals": {"request_tok_s": spread},
        }  # fmt: skip

    results = [
        run("asymspec", "weak", 0.7, 1.0), run("cosine", "weak", 0.7, 1.15), run("standard", "weak", 0.7, 0.5),
        run("asymspec", "weak", 0.0, 1.0), run("cosine", "weak", 0.0, 0.7),
    ]  # fmt: skip
    summary = report.comparisons(results)
    sampled, greedy = summary["separable"]["scale 1, T 0.7"]["weak"], summary["separable"]["scale 1, T 0"]["weak"]
    assert sampled["cosine"]["separable"] is False and sampled["cosine"]["asymspec_above"] is False
    assert sampled["standard"]["separable"] is True and greedy["cosine"]["separable"] is True
    text = report.format_comparisons(summary)
    assert "vs cosine 1.150 [1.050, 1.250]: AsymSpec below, NOT separable (intervals overlap)" in text
