"""Cross-attention scores in integers (models/int8_attention.py): a row's scores are the same bits in
a call of any width and position, they are the stated formula, and their softmax stays close to the
float one. Negative controls: queries quantized by the whole call's scale make rows depend on the
call, and keys quantized without centring lose accuracy where keys share an offset."""

from __future__ import annotations

import torch

from asyncspec.models.fixed_shape import StaticKV, attend_all
from asyncspec.models.int8_attention import QuantizedKeys, integer_scores, quantize_keys
from asyncspec.models.int8_linear import QMAX, quantize_rows, weight_range
from asyncspec.models.selftest import check_invariance
from conftest import synthetic_speech, tiny_whisper

HEADS, FRAMES, HEAD_DIM = 4, 300, 64


def keys_with_a_shared_offset(seed: int = 0) -> torch.Tensor:
    """fp32 [H, T, D_h]: keys around a per-head offset larger than their spread, as encoder keys sit."""
    generator = torch.Generator().manual_seed(seed)
    offset = 4.0 * torch.randn(HEADS, 1, HEAD_DIM, generator=generator)
    return offset + torch.randn(HEADS, FRAMES, HEAD_DIM, generator=generator)


def spread_queries(rows: int = 24, seed: int = 1) -> torch.Tensor:
    """fp32 [H, R, D_h] whose rows' magnitudes differ by 100x (so a shared scale matters)."""
    generator = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-1, 1, rows).view(1, rows, 1)
    return torch.randn(HEADS, rows, HEAD_DIM, generator=generator) * scale


def call_scale_scores(queries: torch.Tensor, keys: QuantizedKeys) -> torch.Tensor:
    """A deliberately wrong variant: the queries quantized by one scale for the whole call."""
    scale = queries.abs().amax().clamp(min=1e-30) / QMAX
    codes = torch.round(queries / scale).clamp(-QMAX, QMAX).to(torch.int8)
    sums = torch.stack([torch._int_mm(codes[h], keys.codes[h]) for h in range(queries.shape[0])])
    return sums.float() * scale * keys.scales


def rows_depending_on_the_call(score, queries, keys, widths=(1, 3, 8, 16)) -> list[int]:
    whole = score(queries, keys)
    differing = set()
    for width in widths:
        parts = torch.cat([score(queries[:, at : at + width], keys) for at in range(0, queries.shape[1], width)], dim=1)
        differing |= {row for row in range(queries.shape[1]) if not torch.equal(parts[:, row], whole[:, row])}
    return sorted(differing)


def test_a_rows_scores_do_not_depend_on_the_call_and_a_call_wide_scale_does():
    keys = quantize_keys(keys_with_a_shared_offset())
    queries = spread_queries()
    assert rows_depending_on_the_call(integer_scores, queries, keys) == []
    assert len(rows_depending_on_the_call(call_scale_scores, queries, keys)) > queries.shape[1] // 2


def test_scores_are_the_stated_formula_in_float64():
    keys = keys_with_a_shared_offset(seed=2)
    quantized = quantize_keys(keys)
    queries = spread_queries(rows=8, seed=3)
    codes, row_scales = quantize_rows(queries.reshape(-1, HEAD_DIM))
    centred = keys - keys.mean(dim=1, keepdim=True)
    key_codes, key_scales = quantize_rows(centred.reshape(-1, HEAD_DIM), weight_range())
    exact_sums = codes.double().view(HEADS, 8, HEAD_DIM) @ key_codes.double().view(HEADS, FRAMES, HEAD_DIM).transpose(
        1, 2
    )
    expected = exact_sums * row_scales.double().view(HEADS, 8, 1) * key_scales.double().view(HEADS, 1, FRAMES)
    got = integer_scores(queries, quantized).double()
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert quantized.shape == keys.shape and quantized.codes.dtype == torch.int8


def weights_error(keys_quantized: QuantizedKeys, keys: torch.Tensor, queries: torch.Tensor) -> float:
    """Largest difference between the softmax of the integer scores and of the float scores."""
    exact = torch.softmax(queries @ keys.transpose(1, 2), dim=-1)
    return float((torch.softmax(integer_scores(queries, keys_quantized), dim=-1) - exact).abs().max())


def test_the_weights_stay_close_to_float_and_uncentred_keys_do_worse():
    keys = keys_with_a_shared_offset(seed=4)
    queries = spread_queries(rows=16, seed=5) * 0.03  # logits spread by a few units, as in a trained model
    centred_error = weights_error(quantize_keys(keys), keys, queries)
    codes, scales = quantize_rows(keys.reshape(-1, HEAD_DIM), weight_range())  # control: no centring
    uncentred = QuantizedKeys(
        codes.view(HEADS, FRAMES, HEAD_DIM).transpose(1, 2).contiguous(), scales.view(HEADS, 1, FRAMES)
    )
    assert centred_error < 0.015
    assert weights_error(uncentred, keys, queries) > 2 * centred_error


def test_attend_all_with_integer_keys_blocks_alike():
    """A stacked call attended one block at a time gives each block the bits of its own call."""
    keys = quantize_keys(keys_with_a_shared_offset(seed=6))
    values_t = torch.randn(HEADS, HEAD_DIM, FRAMES, generator=torch.Generator().manual_seed(7))
    queries = spread_queries(rows=16, seed=8)
    stacked = attend_all(queries, keys, values_t, scale=1.0, block=8)
    alone = torch.cat([attend_all(queries[:, at : at + 8], keys, values_t, scale=1.0) for at in (0, 8)])
    assert torch.equal(stacked, alone)


def test_the_int8_whisper_engine_scores_in_integers_and_float_engines_do_not():
    speech = synthetic_speech(2.0, seed=11)
    for precision, expected in (("int8", QuantizedKeys), (torch.float32, torch.Tensor)):
        target = tiny_whisper(precision, seed=11)
        request = target.request(speech, max_new_tokens=8)
        state = target.prefill(request, target.encode_audio(speech))
        assert isinstance(state.cache, StaticKV)
        assert all(isinstance(keys, expected) for keys, _ in state.cache.cross)
        assert state.cache.nbytes() > 0
        assert check_invariance(target).passed
