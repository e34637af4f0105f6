"""bench cloudedge warms an edge up before its first measured run and again after every restart."""

from __future__ import annotations

from types import SimpleNamespace

from asyncspec.benchmarks import cloudedge
from asyncspec.benchmarks.cloudedge_driver import RunOutput


class FakeEdge:
    def __init__(self, *args):
        self.cold = True

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


def test_warm_up_before_the_first_run_and_after_each_restart(monkeypatch, tmp_path):
    timed_out_runs = {("weak", 5)}  # the measured weak run of the 5-request workload times out
    calls, sizes = [], []

    def fake_run_profile(edge, profile, cloud_port, workload, timeout_s):
        kind = "warm-up" if workload.max_new_tokens == 8 else "run"
        sizes.append(workload.requests)
        calls.append((kind, profile.name))
        timed_out = (profile.name, workload.requests) in timed_out_runs
        if timed_out:
            edge.cold = True  # run_profile restarts an edge whose run timed out
        return RunOutput([], 0.0, 1.0, timed_out, None)

    def fake_metrics(output):
        return dict(throughput_tok_s=0.0, committed_tokens=0, completed=0, requests=0, timed_out=output.timed_out)

    monkeypatch.setattr(cloudedge, "EdgeProcess", FakeEdge)
    monkeypatch.setattr(cloudedge, "run_profile", fake_run_profile)
    monkeypatch.setattr(cloudedge.run_figures, "run_metrics", fake_metrics)
    config = SimpleNamespace(
        methods=["asymspec"], scales=[40.0], profiles=["weak", "medium", "strong"], requests=5,
        max_new_tokens=16, temperatures=[0.0], eps_req=0.0, seed=0, clients=None, rate_per_s=None,
        run_timeout_s=10.0, block_size=7, dtype="fp32",
    )  # fmt: skip
    monkeypatch.setattr(cloudedge, "asdict", vars)
    results = cloudedge.measure(config, 1, "drafter", ["p"] * 5, tmp_path, tmp_path / "partial.json")

    assert calls == [
        ("warm-up", "strong"), ("run", "weak"),  # a fresh edge
        ("warm-up", "strong"), ("run", "medium"),  # restarted after the weak run timed out
        ("run", "strong"),  # still warm
    ]  # fmt: skip
    assert [r["profile"] for r in results] == ["weak", "medium", "strong"]
    assert sizes[0] == 5 and sizes[2] == 1  # the invocation's first warm-up sends every prompt, later ones one
