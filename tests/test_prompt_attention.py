"""A prompt block's rows attend in one masked product (`attend_prompt`), its keys and values are
written in slice copies (`write_rows`), and a shared input is quantized once (`shared_input`):
the first agrees with the row-by-row attention to float rounding and sees no later position, the
other two are bitwise what they replace. The self-test's probe prompt spans two prefill blocks,
so a prompt attention whose bits follow the thread count is caught; with a three-token probe
prompt it would not be. On real Whisper base, a long-form window's 223-token prompt prefills to the
same bits on one thread (As²d beside the producer) and two (target-only alone)."""

from __future__ import annotations

import pytest
import torch

from asyncspec.models import fixed_shape, forward_whisper
from asyncspec.models.fixed_shape import RowSlot, StaticKV, attend_causal, attend_prompt, write_rows
from asyncspec.models.int8_linear import Int8Linear, shared_input
from asyncspec.models.selftest import check_invariance, probe_prompt
from conftest import INT8_REAL, REAL_DTYPE, tiny_causal, tiny_whisper


def _cache(kv_heads: int, slots: int, head_dim: int, seed: int) -> StaticKV:
    generator = torch.Generator().manual_seed(seed)
    cache = StaticKV.empty(1, kv_heads, slots, head_dim)
    cache.keys[0].copy_(torch.randn(kv_heads, slots, head_dim, generator=generator))
    cache.values[0].copy_(torch.randn(kv_heads, slots, head_dim, generator=generator))
    return cache


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2)])  # plain and grouped-query heads
def test_prompt_attention_is_the_row_by_row_attention_to_rounding(heads, kv_heads):
    head_dim, start, rows, width = 16, 21, 13, 16
    cache = _cache(kv_heads, 64, head_dim, seed=3)
    queries = torch.randn(heads, width, head_dim, generator=torch.Generator().manual_seed(4))
    slots = [RowSlot(cache, start + row) for row in range(rows)]
    by_row = attend_causal(queries, [cache.keys[0]] * rows, [cache.values[0]] * rows, slots, scale=0.25)
    block = attend_prompt(queries, cache.keys[0], cache.values[0], start, rows, scale=0.25)
    torch.testing.assert_close(block, by_row, rtol=1e-5, atol=1e-6)
    assert not block[rows:].any()  # padding rows stay zeros


def test_a_prompt_row_sees_no_later_position_and_every_earlier_one():
    heads, head_dim, start, rows, width = 4, 16, 5, 8, 8
    cache = _cache(heads, 32, head_dim, seed=5)
    queries = torch.randn(heads, width, head_dim, generator=torch.Generator().manual_seed(6))
    before = attend_prompt(queries, cache.keys[0], cache.values[0], start, rows, scale=1.0)
    row = 3  # at position start + 3
    cache.keys[0][:, start + row + 1] += 5.0  # a later position of the same block
    cache.values[0][:, start + row + 1] += 5.0
    after = attend_prompt(queries, cache.keys[0], cache.values[0], start, rows, scale=1.0)
    assert torch.equal(after[: row + 1], before[: row + 1])
    assert not torch.equal(after[row + 1], before[row + 1])  # the row at that position sees it
    cache.values[0][:, 0] += 5.0  # the first position: every row attends to it
    earliest = attend_prompt(queries, cache.keys[0], cache.values[0], start, rows, scale=1.0)
    assert all(not torch.equal(earliest[r], after[r]) for r in range(rows))


def test_slice_writes_are_the_row_by_row_writes():
    generator = torch.Generator().manual_seed(7)
    one, other = StaticKV.empty(1, 2, 40, 4), StaticKV.empty(1, 2, 40, 4)
    # runs broken by a position gap, by another request's tensor and by a padding row
    slots = [RowSlot(one, 3), RowSlot(one, 4), RowSlot(one, 9), RowSlot(other, 0), RowSlot(other, 1)]
    slots += [RowSlot(other, 2), RowSlot(other, 2, real=False), RowSlot(one, 10)]
    assert fixed_shape.consecutive_runs([s.cache.keys[0] for s in slots], slots) == [(0, 2), (2, 1), (3, 3), (7, 1)]
    rows = torch.randn(2, len(slots), 4, generator=generator, dtype=torch.bfloat16)
    expected = {id(one): torch.zeros(2, 40, 4), id(other): torch.zeros(2, 40, 4)}
    for row, slot in enumerate(slots):
        if slot.real:
            expected[id(slot.cache)][:, slot.position] = rows[:, row].float()
    for cache in (one, other):
        cache.keys[0].zero_()
    write_rows([s.cache.keys[0] for s in slots], slots, rows)
    assert torch.equal(one.keys[0], expected[id(one)]) and torch.equal(other.keys[0], expected[id(other)])


def test_a_shared_input_quantized_once_is_bitwise_each_linear_alone():
    generator = torch.Generator().manual_seed(8)
    weights = [(torch.randn(n, 64, generator=generator), torch.randn(n, generator=generator)) for n in (32, 48)]
    linears = [Int8Linear(weight, bias) for weight, bias in weights]
    x = torch.randn(1500, 64, generator=generator) * 3
    for shared, alone in zip(shared_input(linears, x), [linear(x) for linear in linears], strict=True):
        assert torch.equal(shared, alone)
    floats = [torch.nn.Linear(64, 16), linears[0]]  # not all int8: each applies its own forward
    for shared, alone in zip(shared_input(floats, x), [linear(x) for linear in floats], strict=True):
        assert torch.equal(shared, alone)


def test_the_probe_prompt_spans_two_prefill_blocks():
    for decoder in (tiny_whisper(torch.float32, seed=2), tiny_causal(torch.float32, seed=2)):
        head = len(probe_prompt(decoder)) - 1  # the last prompt token runs as a decoding call
        assert head > decoder.engine.shape.prefill_width, (decoder.name, head)


def _thread_dependent_past_one_block(monkeypatch, module):
    """A prompt attention that splits long rows across threads and rounds them differently there:
    a prompt block past the first prefill block comes out one part in 10^3 off at 2+ threads."""
    exact = fixed_shape.attend_prompt

    def drifting(queries, keys, values, start, rows, scale):
        out = exact(queries, keys, values, start, rows, scale)
        return out * (1 + 1e-3) if start > 0 and torch.get_num_threads() > 1 else out

    monkeypatch.setattr(module, "attend_prompt", drifting)


def test_the_thread_check_catches_a_prompt_attention_that_follows_the_thread_count(monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        good = tiny_whisper(torch.float32, seed=8)
        assert check_invariance(good, wide_threads=2).wide_equal
        _thread_dependent_past_one_block(monkeypatch, forward_whisper)
        report = check_invariance(good, wide_threads=2)
        assert report.passed and report.wide_equal is False, report.summary()
        # the control: with a three-token probe prompt the same drift goes unseen
        monkeypatch.setattr("asyncspec.models.selftest.probe_prompt", lambda backend: list(backend.prompt_ids()))
        assert check_invariance(good, wide_threads=2).wide_equal
    finally:
        torch.set_num_threads(before)


@pytest.mark.real
@pytest.mark.parametrize("dtype", [INT8_REAL, REAL_DTYPE])
def test_a_long_real_prompt_prefills_to_the_same_bits_on_one_and_two_threads(dtype, monkeypatch):
    """As²d prefills a window beside the producer on one thread and target-only alone on two: a
    long-form window's prompt (223 tokens of previous text, two prefill blocks) must give the
    same keys, values and first logits at both counts, where the self-test let the decoder use both."""
    from asyncspec.data.librivox import librivox_clips
    from asyncspec.models.registry import load_decoder
    from asyncspec.models.row_probe import kv_rows
    from asyncspec.models.selftest import invariance
    from asyncspec.models.threads import torch_threads

    decoder = load_decoder("whisper-base", dtype, encoder="fp32")
    with torch_threads(1):
        if not invariance(decoder, wide_threads=2).may_use(2):
            pytest.skip(f"{dtype}: the self-test keeps the decoder on one thread here")
    text = decoder.tokenizer.encode(" " + " ".join(clip.transcript for clip in librivox_clips())) * 3
    prompt = list(decoder.prompt_ids(timestamps=True, previous=text))
    assert len(prompt) > 223 and len(fixed_shape.prefill_blocks(len(prompt) - 1, decoder.engine.shape)) == 2

    def same_at_one_and_two_threads() -> bool:
        states = []
        for threads in (1, 2):
            with torch_threads(threads):
                state = decoder._new_state(len(prompt), decoder.probe_context())
                decoder.prefill_tokens(state, prompt, len(prompt))
                states.append(state)
        kv_equal = all(torch.equal(a, b) for a, b in zip(kv_rows(states[0]), kv_rows(states[1]), strict=True))
        return kv_equal and torch.equal(states[0].next_logits, states[1].next_logits)

    assert same_at_one_and_two_threads()
    _thread_dependent_past_one_block(monkeypatch, forward_whisper)  # the control: the comparison can fail
    assert not same_at_one_and_two_threads()


def test_prompt_blocks_follow_the_length_alone():
    """A prompt is cut into full prefill blocks, then the rows left rounded up to the decoding
    width: never a padded block wider than the prompt needs, the same blocks for every prompt of
    a length (every run of a request prefills alike)."""
    shape = fixed_shape.CallShape(width=8, prefill_width=128, capacity=448)
    assert fixed_shape.prefill_blocks(0, shape) == []
    assert fixed_shape.prefill_blocks(3, shape) == [8]
    assert fixed_shape.prefill_blocks(128, shape) == [128]
    assert fixed_shape.prefill_blocks(226, shape) == [128, 104]
    for length in range(1, 600):
        blocks = fixed_shape.prefill_blocks(length, shape)
        assert 0 <= sum(blocks) - length < shape.width and all(b % shape.width == 0 for b in blocks)
        assert all(b == shape.prefill_width for b in blocks[:-1]) and blocks[-1] <= shape.prefill_width
