"""How many ready candidates an As²d call carries where the target's calls run at several sizes
(ondevice/call_plan.py): the plan follows the request's acceptance, never changes a committed
token, is replayed as it ran, and its call timings are kept per machine. The control for each: the
old rule (every ready candidate, padded to the full width) on the same producer."""

from __future__ import annotations

import pytest
import torch

from asyncspec.decoding import as2d as as2d_module
from asyncspec.decoding import draw_plan
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models.base import call_sizes
from asyncspec.models.selftest import invariance
from asyncspec.models.threads import torch_threads
from asyncspec.ondevice.call_plan import VerifyPlan
from asyncspec.profiling.replay import NativePricer, ReplayMismatch, replay_as2d
from asyncspec.profiling.trajectory import load_trajectories, reference_trajectory, save_trajectories
from conftest import synthetic_speech, tiny_whisper
from test_as2d import ScriptedProducer
from test_narrow_calls import WidthLog
from test_replay import DelayedProducer

# whisper-base int8, two threads, Zen 2 (2026-12-06): seconds of one call of 1, 2, 4 and 8 rows
ZEN2_SECONDS = {1: 0.0133, 2: 0.0150, 4: 0.0194, 8: 0.0250}
# the same, later that day, the calls through the TorchScript graph and proven at every width
ZEN2_GRAPH_SECONDS = {1: 0.00787, 2: 0.00884, 3: 0.00986, 4: 0.01154, 5: 0.01335, 6: 0.01492, 7: 0.01643, 8: 0.01549}


def test_the_plan_carries_what_pays_for_its_call():
    plan = VerifyPlan(dict(ZEN2_SECONDS))
    assert plan.alpha == 0.5 and plan.carried(0) == 0
    assert plan.carried(7) == 1  # 1.5 expected tokens in 15.0 ms beat 1.99 in 25.0 and 1 in 13.3
    for _ in range(6):  # a producer in step with the target
        plan.observe(plan.carried(7), plan.carried(7))
    assert plan.alpha > 0.9 and plan.carried(7) == 7 and plan.carried(2) == 2
    for _ in range(15):  # it lost its alignment: every round rejects the first candidate
        plan.observe(plan.carried(7), 0)
    assert plan.alpha < 0.3 and plan.carried(7) <= 1
    # one size only (a float engine's width): every ready candidate is carried, as before plans
    assert VerifyPlan({8: 0.025}).carried(5) == 5
    assert VerifyPlan({8: 0.025}, accepted=0.0, rejected=50.0).carried(5) == 5


def test_a_plan_that_stopped_carrying_tries_again():
    plan = VerifyPlan({1: 0.010, 2: 0.0125, 4: 0.016, 8: 0.022})
    carried = []
    for _ in range(60):  # the producer is no use: every candidate carried is rejected
        carried.append(plan.carried(7))
        plan.observe(carried[-1], 0)
    settled = carried[20:]
    assert max(settled) <= 1 and settled.count(0) > settled.count(1) > 0  # mostly one-row calls
    # rounds carrying nothing decay the rejections, so a candidate is tried again within a few
    gaps = [len(run) for run in "".join(map(str, settled)).split("1") if run]
    assert max(gaps) < 10


def test_a_plan_carries_no_more_than_its_widest_call_holds():
    plan = VerifyPlan({2: 0.015, 8: 0.025}, accepted=100.0, rejected=0.0)  # alpha near 1
    assert plan.carried(15) == 7  # the rest waits for the next round, after a root of its own
    with pytest.raises(ValueError):
        VerifyPlan({})
    with pytest.raises(ValueError):
        VerifyPlan({0: 0.01})


def narrow_int8_whisper(seed: int):
    target = tiny_whisper("int8", seed=seed)
    assert invariance(target, use_cache=False).narrow_widths == (1, 2, 3, 4, 5, 6, 7)
    request = target.request(synthetic_speech(3.0, seed=seed), max_new_tokens=40)
    truth = METHODS["target"](target, None, request, DecodeConfig()).tokens
    assert len(truth) > 16
    return target, request, truth


def as2d_widths(target, producer, request) -> tuple[list[int], list[int]]:
    """(As²d's tokens, the engine's row count of every decoding call)."""
    log = target.engine.forward = WidthLog(target.engine.forward)
    try:
        tokens = METHODS["as2d"](target, producer, request, DecodeConfig(budget=7)).tokens
    finally:
        target.engine.forward = log.inner
    return tokens, log.widths


@pytest.fixture
def zen2_costs(monkeypatch):
    monkeypatch.setattr(as2d_module, "kept_size_costs", lambda target, scratch: dict(ZEN2_GRAPH_SECONDS))


def test_a_producer_out_of_step_gets_narrow_calls_and_the_output_is_unchanged(zen2_costs, monkeypatch):
    with torch_threads(1):
        target, request, truth = narrow_int8_whisper(31)
        assert call_sizes(target) == tuple(range(1, 9))
        wrong = [token + 1 for token in truth]  # never the target's token
        planned, planned_rows = as2d_widths(target, ScriptedProducer(wrong), request)
        perfect, perfect_rows = as2d_widths(target, ScriptedProducer(truth), request)
        monkeypatch.setattr(as2d_module, "verify_plan", lambda target: None)  # the control: the old rule
        unplanned, unplanned_rows = as2d_widths(target, ScriptedProducer(wrong), request)
    assert planned == unplanned == perfect == truth
    # the old rule: seven wrong candidates a call (fewer only as the token limit nears), one token each
    assert unplanned_rows.count(8) >= len(unplanned_rows) - 8 and len(unplanned_rows) == len(truth)
    # planned: after a first round carried on the prior, at most a candidate a call
    assert max(planned_rows[2:]) <= 2 and sum(planned_rows) < sum(unplanned_rows) / 3
    # in step, the plan soon carries all seven: about one call per eight tokens
    assert len(perfect_rows) <= len(truth) // 8 + 3


def test_replay_reproduces_a_planned_run(zen2_costs):
    with torch_threads(1):
        target, request, truth = narrow_int8_whisper(32)
        noisy = truth[:6] + [1000] + truth[6:20] + truth[21:]
        native = METHODS["as2d"](target, DelayedProducer(noisy, 4, 0.01), request, DecodeConfig(budget=7))
        reference = METHODS["target"](target, None, request, DecodeConfig())
        trajectory = reference_trajectory("w", "d", request.audio, target, reference, request)
    trajectory.add_native("as2d:delayed", native, 7)
    assert trajectory.call_sizes == list(range(1, 9)) and trajectory.call_seconds == ZEN2_GRAPH_SECONDS
    pricer = NativePricer(trajectory.native["as2d:delayed"])
    assert replay_as2d(trajectory, "delayed", 7, pricer).widths == native.stats.call_widths
    trajectory.call_seconds = None  # the control: replayed without the plan, other calls are made
    with pytest.raises(ReplayMismatch):
        replay_as2d(trajectory, "delayed", 7, pricer)


def test_trajectory_files_keep_the_call_sizes_and_read_older_ones(tmp_path):
    from test_replay import trajectory

    window = trajectory([])
    window.call_sizes, window.call_seconds = [1, 2, 4, 8], dict(ZEN2_SECONDS)
    save_trajectories(tmp_path / "t.json", [window])
    (loaded,) = load_trajectories(tmp_path / "t.json")
    assert loaded.call_sizes == [1, 2, 4, 8] and loaded.call_seconds == ZEN2_SECONDS  # int keys again
    older = (tmp_path / "t.json").read_text().replace('"call_sizes": [1, 2, 4, 8]', '"call_width": 8')
    older = older.replace(', "call_seconds": {"1": 0.0133, "2": 0.015, "4": 0.0194, "8": 0.025}', "")
    (tmp_path / "old.json").write_text(older)
    (old,) = load_trajectories(tmp_path / "old.json")
    assert old.call_sizes == [8] and old.call_seconds is None


def test_call_sizes_are_timed_once_per_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    timed = []
    real = draw_plan.size_costs

    def timing(engine, cache, position, sizes):
        timed.append(tuple(sizes))
        return real(engine, cache, position, sizes)

    monkeypatch.setattr(draw_plan, "size_costs", timing)
    with torch_threads(1):
        target, _, _ = narrow_int8_whisper(33)
        first = as2d_module.verify_plan(target)
        again = as2d_module.verify_plan(target)
    assert first is not None and again is not None and timed == [tuple(range(1, 9))]
    assert first.seconds == again.seconds and all(seconds > 0 for seconds in first.seconds.values())
    assert as2d_module.verify_plan(tiny_whisper(torch.float32, seed=33)) is None  # one size: no plan
