"""A fallback's draws verifying candidates from the window's earlier attempts
(decoding/speculative_draws.py): every draw is bitwise its own target-only decode (tokens,
log-probabilities, timestamps, finish), in fewer target calls. The controls: an engine whose rows
see each other, a draw that keeps its rejected candidates' keys and values, and stacks wider than
the batch check proved on a kernel that rounds wide calls differently all fail the comparison."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import pytest
import torch

from asyncspec.decoding import draw_plan, speculative_draws
from asyncspec.decoding.draw_lookup import DrawLookup, ReferenceIndex
from asyncspec.decoding.draw_plan import call_costs, plan_rows
from asyncspec.decoding.speculative_draws import decode_speculative_draws
from asyncspec.decoding.target_draws import decode_target_draws
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.call_stacks import stack_sizes
from asyncspec.models.selftest import check_invariance
from conftest import tiny_whisper
from test_cloudedge_batching import _width_variant_linear
from test_target_draws import RowMixingForward, draw_configs, same_draws, timed_request

PEAK = 20.0  # logits peaked enough that draws at low temperatures often retrace the greedy attempt


def window(dtype=torch.float32, seed: int = 12, tokens: int = 40):
    whisper = tiny_whisper(dtype, seed=seed, peak=PEAK)
    request = timed_request(whisper, tokens)
    return whisper, request, [decode_target_only(whisper, None, request).tokens]


@pytest.fixture
def wide_calls_cheap(monkeypatch):
    """Calls of any width cost the same, so the plan stacks as wide as it is allowed: on the tiny
    model a wide call costs about its rows' worth and the plan would seldom widen."""

    def flat(target, scratch, most_blocks):
        return {blocks: 0.01 for blocks in [1, *stack_sizes(most_blocks)]}

    monkeypatch.setattr(speculative_draws, "kept_call_costs", flat)


def compared(whisper, request, references, temperature=0.3, most_blocks=1, count=5):
    configs = draw_configs(count, temperature)
    alone = [decode_target_only(whisper, None, request, config) for config in configs]
    return alone, decode_speculative_draws(whisper, request, configs, references, most_blocks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_speculative_draws_are_bitwise_the_draws_alone_in_fewer_calls(dtype):
    whisper, request, references = window(dtype)
    alone, spec = compared(whisper, request, references)
    assert same_draws(alone, spec)
    assert sum(d.stats.accepted for d in spec) > 0  # candidates were accepted: the path is exercised
    assert sum(d.stats.accepted < d.stats.drafted for d in spec) > 0  # ... and some rejected
    steps = max(d.stats.target_calls for d in spec)
    assert steps < max(len(d.tokens) for d in alone)  # fewer calls than one token per call
    timestamps = [t for draw in spec for t in draw.tokens if t >= whisper.timestamp_rules.timestamp_begin]
    assert timestamps  # the timestamp rules ran on candidate rows too


def test_hot_draws_with_poor_references_stay_exact():
    whisper, request, _ = window(seed=13)
    alone, spec = compared(whisper, request, [[50364, 440, 441, 442, 443, 444]], temperature=1.0, count=3)
    assert same_draws(alone, spec) and len({tuple(d.tokens) for d in spec}) > 1


@pytest.mark.parametrize("dtype", [torch.float32, "int8"])
def test_stacked_calls_where_the_batch_check_proved_them_are_exact(wide_calls_cheap, dtype):
    """On a Zen 4 EPYC (one thread) both failed while a stacked call's cross-attention ran as one
    product over all its rows: fp32 in the batch check, int8 past it (a draw's log-probability at
    position 19 moved in the 7th digit). It now runs one block at a time (fixed_shape.attend_all)."""
    whisper, request, references = window(dtype, seed=14)
    report = check_invariance(whisper, stacked_blocks=8)
    most = report.stacking(torch.get_num_threads())
    assert most >= 2, report.summary()  # the tiny model's rows are invariant on every CPU seen
    # at 0.6 the draws part early (at 0.3 they share one set of rows and never fill a block)
    alone, spec = compared(whisper, request, references, temperature=0.6, most_blocks=most, count=8)
    assert same_draws(alone, spec)
    blocks = [event.meta["blocks"] for event in spec[0].trace.events if event.stage == "verify"]
    assert max(blocks) > 1  # calls wider than one block ran


def test_a_kernel_variant_past_one_block_is_caught_by_the_batch_check_and_forcing_it_breaks_exactness(
    monkeypatch, wide_calls_cheap
):
    _width_variant_linear(monkeypatch, 8)
    whisper, request, references = window(seed=14)
    whisper.name += "-block-variant"
    report = check_invariance(whisper, stacked_blocks=8)
    assert report.passed and report.stacking(torch.get_num_threads()) == 1, report.summary()
    alone, proven = compared(whisper, request, references, temperature=0.6, most_blocks=1, count=8)
    assert same_draws(alone, proven)
    _, forced = compared(whisper, request, references, temperature=0.6, most_blocks=8, count=8)
    assert max(event.meta["blocks"] for event in forced[0].trace.events if event.stage == "verify") > 1
    assert not same_draws(alone, forced)


def test_the_comparison_fails_on_an_engine_whose_rows_see_each_other():
    whisper, request, references = window()
    whisper.engine.forward = RowMixingForward(whisper.engine.forward)
    alone, spec = compared(whisper, request, references)
    assert not same_draws(alone, spec)


def test_the_comparison_fails_when_rejected_candidates_are_not_rolled_back(monkeypatch):
    whisper, request, references = window()
    monkeypatch.setattr(type(whisper), "rollback", lambda self, state, length: None)
    alone, spec = compared(whisper, request, references)
    assert not same_draws(alone, spec)


def test_the_draws_equal_target_draws_side_by_side():
    whisper, request, references = window(seed=15)
    configs = draw_configs(5, 0.4)
    spec = decode_speculative_draws(whisper, request, configs, references)
    assert same_draws(decode_target_draws(whisper, request, configs), spec)
    assert all(d.method == "target" and d.stats.notes["decoded_beside"] == 5 for d in spec)


def test_greedy_configs_are_refused():
    whisper, request, references = window()
    with pytest.raises(ValueError, match="positional samples"):
        decode_speculative_draws(whisper, request, draw_configs(1, 0.0), references)


def test_lookup_prefers_the_first_reference_then_the_draw_itself():
    index = ReferenceIndex([[1, 2, 3, 4, 5], [9, 2, 3, 7, 8]])
    lookup = DrawLookup(index)
    assert lookup.propose([], 3) == [1, 2, 3]  # nothing sampled yet: the first reference's start
    assert lookup.propose([2, 3], 2) == [4, 5]  # both references hold "2 3": the first wins
    assert lookup.propose([9, 2, 3], 2) == [7, 8]  # the longer suffix "9 2 3" only the second holds
    own = DrawLookup(index)  # one draw's lookup follows one growing output
    assert own.propose([6, 6, 11, 12, 6], 3) == [11, 12, 6]  # its own output, the latest "6"
    assert own.propose([6, 6, 11, 12, 6, 42], 3) == []  # nothing continues "42"
    assert lookup.propose([2, 3], 0) == []


def test_the_plan_gives_every_draw_its_root_and_widens_only_where_it_pays():
    costs = {1: 0.024, 2: 0.031, 4: 0.044, 8: 0.073}
    confident = plan_rows([7] * 5, [0.95] * 5, 8, costs, 8)
    assert confident.blocks >= 2 and sum(confident.candidates) + 5 <= confident.blocks * 8
    doubtful = plan_rows([7] * 5, [0.05] * 5, 8, costs, 8)
    assert doubtful.blocks == 1 and sum(doubtful.candidates) <= 3
    unproven = plan_rows([7] * 5, [0.95] * 5, 8, costs, 1)
    assert unproven.blocks == 1 and sum(unproven.candidates) == 3
    few = plan_rows([1, 0, 2], [0.9] * 3, 8, costs, 8)
    assert few.blocks == 1 and few.candidates == [1, 0, 2]  # never more than a draw proposed
    many = plan_rows([0] * 10, [0.5] * 10, 8, costs, 1)
    assert many.blocks == 2 and many.candidates == [0] * 10  # more draws than one call's rows


def test_the_call_costs_are_measured_once_per_thread_count():
    whisper, request, _ = window()
    state = whisper.prefill(request)
    first = call_costs(whisper.engine, whisper.copy_state(state).cache, state.length, 4)
    again = call_costs(whisper.engine, whisper.copy_state(state).cache, state.length, 4)
    assert set(first) == {1, 2, 4} and first == again and all(cost > 0 for cost in first.values())


class _WakingEngine:
    """An engine whose first two calls at a thread count are slow (its threads waking): 30 ms, then 10."""

    def __init__(self):
        self.shape = SimpleNamespace(width=8)
        self.pad_id, self.calls, self.clock = 0, 0, 0.0

    def run_rows(self, slots, tokens, blocks):
        self.calls += 1
        self.clock += 0.030 if self.calls <= 2 else 0.010


def test_a_call_is_timed_after_its_threads_have_woken(monkeypatch):
    """A kept cost decides the decoder's thread count for good: timed from cold, best of two, a
    two-thread call once measured slower than a one-thread call that it beats by a quarter."""
    engine = _WakingEngine()
    monkeypatch.setattr(draw_plan.time, "perf_counter", lambda: engine.clock)
    assert call_costs(engine, None, 0, 1) == {1: pytest.approx(0.010)}
    # the control: without the warm-up calls, two timed calls see only the waking ones
    monkeypatch.setattr(draw_plan, "WARM_UP_CALLS", 0)
    monkeypatch.setattr(draw_plan, "TIMED_CALLS", 2)
    cold = _WakingEngine()
    monkeypatch.setattr(draw_plan.time, "perf_counter", lambda: cold.clock)
    assert call_costs(cold, None, 0, 1) == {1: pytest.approx(0.030)}


def test_the_call_costs_are_kept_per_machine_and_openmp_setting(monkeypatch, tmp_path):
    """Timed in every process, the costs took a transcriber's first fallback 0.4 s; kept, a new
    process reads them back. The control: under another OpenMP setting they are timed anew."""
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    whisper, request, _ = window()
    state = whisper.prefill(request)

    def scratch():
        return whisper.copy_state(state).cache, state.length

    first = draw_plan.kept_call_costs(whisper, scratch, 4)
    assert set(first) == {1, 2, 4} and all(cost > 0 for cost in first.values())
    monkeypatch.setattr(draw_plan, "_COSTS", weakref.WeakKeyDictionary())  # a new process: nothing timed
    timed = []
    monkeypatch.setattr(draw_plan, "call_costs", lambda *args: timed.append(args) or {1: 1.0, 2: 1.0, 4: 1.0})
    assert draw_plan.kept_call_costs(whisper, scratch, 4) == first and not timed
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert draw_plan.kept_call_costs(whisper, scratch, 4) == {1: 1.0, 2: 1.0, 4: 1.0} and len(timed) == 1
