"""The int8 decoding call as one TorchScript graph (models/scripted_step.py for Whisper,
models/scripted_causal.py for Qwen2 and Llama layouts) computes the eager forward's bits: hidden
states and written keys/values, at every width and with padding rows, in tiny models and in
whisper-base and Qwen2.5-Coder 0.5B; target-only output through the engine is unchanged. The
control: a graph given one weight scale off by an ulp gives other bits, and the comparison says
so. Rows of several requests side by side (a window's fallback draws, the cloud's batch), with
padding among them, give the eager bits too; the control there: a graph told a row belongs to
another request gives other bits. Calls the graph does not cover (a prompt block, a word-timestamp
record, an engine that is not int8, a linear on oneDNN's packing, Qwen3's per-head norms) run
eagerly; a record of the cross-attention, which the graph does not keep, is still written."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models import int8_fbgemm, int8_linear
from asyncspec.models.attention_record import AttentionRecord
from asyncspec.models.base import DecodeRequest
from asyncspec.models.fixed_shape import RowSlot, block_slots
from asyncspec.models.scripted_step import CallLayout
from conftest import synthetic_speech, tiny_causal, tiny_whisper

pytestmark = pytest.mark.skipif(not int8_fbgemm.available(), reason="this torch build has no FBGEMM")


def prefilled(target, seed: int):
    state = target.prefill(target.request(synthetic_speech(2.0, seed=seed), max_new_tokens=24))
    return state, state.length


def one_block(forward, cache, start: int, tokens: list[int], width: int, scripted) -> tuple[torch.Tensor, list]:
    """Hidden states of the real rows and every layer's keys/values up to them, with `scripted`
    (or None: eager) in place."""
    saved, forward.scripted = forward.scripted, scripted
    try:
        ids = torch.tensor(tokens + [0] * (width - len(tokens)))
        hidden = forward(block_slots(cache, start, len(tokens)), ids)[: len(tokens)].clone()
    finally:
        forward.scripted = saved
    end = start + len(tokens)
    return hidden, [t[:, :end].clone() for t in (*cache.keys, *cache.values)]


def assert_same_bits(forward, cache, start: int, tokens: list[int], width: int, scripted) -> None:
    eager_hidden, eager_kv = one_block(forward, cache, start, tokens, width, None)
    hidden, kv = one_block(forward, cache, start, tokens, width, scripted)
    assert torch.equal(hidden, eager_hidden), f"{len(tokens)} rows in {width}"
    assert all(torch.equal(a, b) for a, b in zip(kv, eager_kv, strict=True)), f"{len(tokens)} rows in {width}"


@pytest.mark.parametrize("layout", ["fbgemm", "nk"])
def test_the_graph_gives_the_eager_bits_at_every_width_and_with_padding(layout, monkeypatch):
    monkeypatch.setattr(int8_linear, "measured_layout", lambda quantized: (layout, None))
    target = tiny_whisper("int8", seed=31, peak=20.0)
    forward = target.engine.forward
    assert forward.scripted is not None
    assert {kind for kind, *_ in forward.scripted.linears} == {0 if layout == "fbgemm" else 1}
    state, start = prefilled(target, 31)
    for rows, width in [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)]:
        assert_same_bits(forward, state.cache, start, list(range(300, 300 + rows)), width, forward.scripted)


def test_the_control_a_graph_one_ulp_off_gives_other_bits():
    target = tiny_whisper("int8", seed=32, peak=20.0)
    forward = target.engine.forward
    state, start = prefilled(target, 32)
    wrong = copy.copy(forward.scripted)
    kind, packed, operand, zero_point, scale, bias = wrong.linears[0]
    wrong.linears = [(kind, packed, operand, zero_point, torch.nextafter(scale, scale + 1), bias), *wrong.linears[1:]]
    with pytest.raises(AssertionError):
        assert_same_bits(forward, state.cache, start, [300, 301], 2, wrong)


def side_by_side(forward, caches, rows, width: int, scripted) -> tuple[torch.Tensor, list]:
    """One call over copies of `caches`, rows (request, position, token) or None for padding (at
    the row before's position), with `scripted` (None: eager) in place: the real rows' hidden
    states and every copy's keys/values."""
    copies = [cache.copy() for cache in caches]
    slots, ids = [], []
    for row in rows:
        if row is None:
            slots.append(RowSlot(slots[-1].cache, slots[-1].position, real=False))
            ids.append(0)
        else:
            slots.append(RowSlot(copies[row[0]], row[1]))
            ids.append(row[2])
    saved, forward.scripted = forward.scripted, scripted
    try:
        hidden = forward(slots, torch.tensor(ids + [0] * (width - len(ids))))
    finally:
        forward.scripted = saved
    real = [index for index, row in enumerate(rows) if row is not None]
    return hidden[real].clone(), [t.clone() for copy in copies for t in (*copy.keys, *copy.values)]


def assert_side_by_side_same_bits(forward, caches, rows, width: int, scripted) -> None:
    eager_hidden, eager_kv = side_by_side(forward, caches, rows, width, None)
    hidden, kv = side_by_side(forward, caches, rows, width, scripted)
    assert torch.equal(hidden, eager_hidden), f"rows {rows}"
    # bit patterns: slots never written hold whatever the allocation held, NaN included
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(kv, eager_kv, strict=True))


def diverged(target, state, extra: int):
    """A copy of a prefilled state's cache, `extra` tokens further on (another draw of its window)."""
    cache = state.cache.copy()
    if extra:
        target.engine.forward(block_slots(cache, state.length, extra), torch.arange(20, 20 + extra))
    return cache, state.length + extra


def several_requests_rows(start: int) -> list:
    """Three requests at starts start, start + 2, start + 5: one row, two rows and padding, a row,
    and padding at the end of the call's real rows."""
    return [(0, start, 300), (1, start + 2, 301), (1, start + 3, 302), None, (2, start + 5, 303)]


class WrongRequest:
    """The control: a graph told that every row of request 1 belongs to request 0."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, *args):
        slots = args[-1]
        first = slots[0].cache
        moved = [RowSlot(first, slot.position, slot.real) if slot.cache is slots[1].cache else slot for slot in slots]
        return self.inner(*args[:-1], moved)


def test_rows_of_several_requests_with_padding_give_the_eager_bits():
    target = tiny_whisper("int8", seed=35, peak=20.0)
    forward = target.engine.forward
    state, start = prefilled(target, 35)
    caches = [diverged(target, state, extra)[0] for extra in (0, 2, 5)]
    rows = several_requests_rows(start)
    assert CallLayout.of([RowSlot(caches[r[0]], r[1]) for r in rows if r]).runs == [
        (0, 1, 0, start),
        (1, 2, 1, start + 2),
        (3, 1, 2, start + 5),
    ]
    for width in (5, 8):
        assert_side_by_side_same_bits(forward, caches, rows, width, forward.scripted)
    with pytest.raises(AssertionError):
        assert_side_by_side_same_bits(forward, caches, rows, 8, WrongRequest(forward.scripted))


def target_only_both_ways(target, request) -> list[int]:
    """Target-only tokens with the graph, checked equal to those without it."""
    forward = target.engine.forward
    scripted = METHODS["target"](target, None, request, DecodeConfig()).tokens
    saved, forward.scripted = forward.scripted, None
    try:
        eager = METHODS["target"](target, None, request, DecodeConfig()).tokens
    finally:
        forward.scripted = saved
    assert scripted == eager and len(scripted) > 8
    return scripted


def test_target_only_output_and_logits_are_unchanged_through_the_engine():
    target = tiny_whisper("int8", seed=33, peak=20.0)
    request = target.request(synthetic_speech(2.0, seed=33), max_new_tokens=24)
    scripted = target_only_both_ways(target, request)
    forward = target.engine.forward
    saved, logits = forward.scripted, []
    for graph in (saved, None):
        forward.scripted = graph
        state = target.prefill(request)
        logits.append(target.extend(state, scripted[:5]))
    forward.scripted = saved
    assert torch.equal(logits[0], logits[1])


class CallCounter:
    """Wraps a ScriptedWhisperStep, counting the calls it computes."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, *args):
        self.calls += 1
        return self.inner(*args)


def test_calls_the_graph_does_not_cover_run_eagerly():
    target = tiny_whisper("int8", seed=34, peak=20.0)
    forward = target.engine.forward
    counter = forward.scripted = CallCounter(forward.scripted)
    state, start = prefilled(target, 34)
    other = state.cache.sibling()  # another request over the same encoder output
    before = counter.calls
    forward(block_slots(state.cache, start, 3), torch.tensor([300, 301, 302, 0]), prompt=True)  # a prompt block
    wide = block_slots(state.cache, start, forward.block_rows + 1)
    forward(wide, torch.arange(300, 300 + forward.block_rows + 1))  # wider than a cross-attention block
    recorded = state.cache.copy()
    recorded.attention = AttentionRecord.empty(target.alignment_heads, recorded.slots, 1500)  # word timestamps
    recorded.attention.weights.zero_()
    forward(block_slots(recorded, start, 1), torch.tensor([300]))
    assert counter.calls == before and recorded.attention.weights[start].abs().sum() > 0
    target.extend(state, [300])  # the control: a decoding call of one request
    forward(block_slots(state.cache, start + 1, 1) + block_slots(other, 0, 1), torch.tensor([301, 302]))  # or two
    assert counter.calls == before + 2
    for engine_target in (tiny_whisper(torch.float32, seed=34), tiny_whisper("int8", seed=34, engine="transformers")):
        assert getattr(engine_target.engine, "forward", None) is None or engine_target.engine.forward.scripted is None


def test_a_linear_on_onednn_packing_leaves_the_eager_forward(monkeypatch):
    if not int8_linear.int8_packed.available():
        pytest.skip("this torch build has no oneDNN int8 inner product")
    monkeypatch.setattr(int8_linear, "measured_layout", lambda quantized: ("packed", None))
    assert tiny_whisper("int8", seed=36).engine.forward.scripted is None


@pytest.mark.real
def test_real_whisper_base_int8_calls_give_the_eager_bits():
    from asyncspec.audio import load_audio
    from asyncspec.data.librivox import librivox_clips
    from asyncspec.models.registry import load_decoder

    target = load_decoder("whisper-base", "int8", encoder="fp32")
    forward = target.engine.forward
    assert forward.scripted is not None
    state = target.prefill(target.request(load_audio(librivox_clips()[0].path)))
    tokens = [target.greedy(target.extend(state, [50364]))[-1]]
    for _ in range(12):
        tokens.append(target.greedy(target.extend(state, tokens[-1:]))[-1])
    for rows, width in [(1, 1), (2, 2), (3, 4), (8, 8)]:
        assert_same_bits(forward, state.cache, state.length, tokens[:rows], width, forward.scripted)
    # five draws of a fallback side by side, one row each at their own positions
    caches = [diverged(target, state, extra)[0] for extra in range(5)]
    rows = [(draw, state.length + draw, tokens[draw]) for draw in range(5)]
    assert_side_by_side_same_bits(forward, caches, rows, 8, forward.scripted)


def causal_prefilled(target):
    state = target.prefill(DecodeRequest((5, 9, 14, 2), max_new_tokens=24))
    return state, state.length


@pytest.mark.parametrize("layout", ["qwen2", "llama"])
def test_the_causal_graph_gives_the_eager_bits_at_every_width_and_with_padding(layout):
    target = tiny_causal("int8", seed=41, layout=layout, init_std=0.2)
    forward = target.engine.forward
    assert forward.scripted is not None
    state, start = causal_prefilled(target)
    for rows, width in [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8)]:
        assert_same_bits(forward, state.cache, start, list(range(20, 20 + rows)), width, forward.scripted)
    wrong = copy.copy(forward.scripted)  # the control: one weight scale an ulp off
    kind, packed, operand, zero_point, scale, bias = wrong.linears[2]
    wrong.linears = [*wrong.linears[:2], (kind, packed, operand, zero_point, torch.nextafter(scale, scale + 1), bias)]
    wrong.linears += forward.scripted.linears[3:]
    with pytest.raises(AssertionError):
        assert_same_bits(forward, state.cache, start, [20, 21], 2, wrong)


@pytest.mark.parametrize("layout", ["qwen2", "llama"])
def test_causal_rows_of_several_requests_with_padding_give_the_eager_bits(layout):
    target = tiny_causal("int8", seed=43, layout=layout, init_std=0.2)
    forward = target.engine.forward
    state, start = causal_prefilled(target)
    caches = [diverged(target, state, extra)[0] for extra in (0, 2, 5)]
    rows = [(r[0], r[1], r[2] - 280) if r else None for r in several_requests_rows(start)]
    for width in (5, 8):
        assert_side_by_side_same_bits(forward, caches, rows, width, forward.scripted)
    with pytest.raises(AssertionError):
        assert_side_by_side_same_bits(forward, caches, rows, 8, WrongRequest(forward.scripted))


def test_the_clouds_stacked_calls_through_the_causal_graph_give_the_eager_logits():
    """run_stacked: three requests' blocks side by side in one call, each padded as in its own."""
    target = tiny_causal("int8", seed=44, init_std=0.2)
    forward, engine = target.engine.forward, target.engine
    state, start = causal_prefilled(target)
    parts = [(state.cache.copy(), start, list(range(20, 20 + n))) for n in (3, 8, 11)]

    def stacked(scripted) -> list[torch.Tensor]:
        saved, forward.scripted = forward.scripted, scripted
        try:
            return engine.run_stacked([(cache.copy(), at, tokens) for cache, at, tokens in parts], 4)
        finally:
            forward.scripted = saved

    counter = CallCounter(forward.scripted)
    graph, eager = stacked(counter), stacked(None)
    assert counter.calls >= 1 and all(torch.equal(a, b) for a, b in zip(graph, eager, strict=True))


def test_causal_target_only_output_is_unchanged_and_uncovered_models_run_eagerly():
    target = tiny_causal("int8", seed=42, init_std=0.2)
    request = DecodeRequest((5, 9, 14, 2), max_new_tokens=24)
    target_only_both_ways(target, request)
    assert tiny_causal("int8", seed=42, layout="qwen3").engine.forward.scripted is None  # per-head norms
    assert tiny_causal(torch.float32, seed=42).engine.forward.scripted is None


@pytest.mark.real
def test_real_qwen_05b_int8_calls_give_the_eager_bits():
    from asyncspec.models.registry import load_decoder

    target = load_decoder("qwen2.5-coder-0.5b", "int8")
    forward = target.engine.forward
    assert forward.scripted is not None
    state = target.prefill(target.request("def fibonacci(n):\n    ", max_new_tokens=16))
    tokens = [target.greedy(target.extend(state, [151643]))[-1]]
    for _ in range(6):
        tokens.append(target.greedy(target.extend(state, tokens[-1:]))[-1])
    for rows, width in [(1, 1), (2, 2), (3, 4), (7, 8)]:
        assert_same_bits(forward, state.cache, state.length, tokens[:rows], width, forward.scripted)
    caches = [diverged(target, state, extra)[0] for extra in (0, 2, 5)]
    rows = [(r[0], r[1], tokens[index]) if r else None for index, r in enumerate(several_requests_rows(state.length))]
    assert_side_by_side_same_bits(forward, caches, rows, 8, forward.scripted)
