"""Cross-attention in integers (models/int8_attention.py): a row's scores and weighted sums are the
same bits in a call of any width and position, they are the stated formulas, and they stay close to
the float ones. Negative controls: queries or weights quantized by the whole call's scale make rows
depend on the call, keys quantized without centring lose accuracy where keys share an offset, and
weights rounded to one 8-bit digit lose a peaked row's tail."""

from __future__ import annotations

import torch

from asyncspec.models.fixed_shape import StaticKV, attend_all
from asyncspec.models.int8_attention import (
    QuantizedKeys,
    QuantizedValues,
    integer_scores,
    integer_weighted_sum,
    quantize_keys,
    quantize_values,
    weight_digits,
)
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
    sums = torch.stack([torch._int_mm(codes[h], keys.codes[h].to(torch.int8)) for h in range(queries.shape[0])])
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
    assert quantized.shape == keys.shape and quantized.codes.dtype in (torch.int8, torch.float32)


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
    assert centred_error < 0.015 * QMAX / weight_range()  # the keys' rounding: 7-bit keys where 8 bits saturate
    # 8-bit keys: over 2x worse uncentred; 7-bit keys (Zen 2, AVX2): 0.032 against 0.018
    assert weights_error(uncentred, keys, queries) > 1.5 * centred_error


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
        values_kind = QuantizedValues if precision == "int8" else torch.Tensor
        assert all(isinstance(values, values_kind) for _, values in state.cache.cross)
        assert state.cache.nbytes() > 0
        assert check_invariance(target).passed


def peaked_weights(rows: int = 24, seed: int = 9) -> torch.Tensor:
    """fp32 [H, R, T] softmax rows from nearly uniform to one frame holding ~90 %: a long tail of
    small weights, as a decoder row attends over 1,500 encoder frames."""
    generator = torch.Generator().manual_seed(seed)
    sharpness = torch.linspace(0.1, 12.0, rows).view(1, rows, 1)
    logits = torch.randn(HEADS, rows, FRAMES, generator=generator) * sharpness
    return torch.softmax(logits, dim=-1)


def float_values(seed: int = 10) -> torch.Tensor:
    """fp32 [H, D_h, T]: values transposed, as attend_all keeps them; channels of different ranges."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(HEADS, HEAD_DIM, FRAMES, generator=generator) * torch.logspace(-1, 1, HEAD_DIM).view(1, -1, 1)


def call_scale_weighted_sum(weights: torch.Tensor, values: QuantizedValues) -> torch.Tensor:
    """A deliberately wrong variant: the weights' digits scaled by the whole call's largest weight."""
    heads, rows, _ = weights.shape
    base = weight_range() + 1
    scale = weights.amax() / (base * base - 1)
    levels = torch.round(weights / scale)
    high = torch.floor(levels / base)
    digits = torch.cat((high, levels - high * base), dim=1).to(torch.int8)
    sums = torch.stack([torch._int_mm(values.codes[h].to(torch.int8), digits[h].t()) for h in range(heads)]).double()
    out = (sums[:, :, :rows] * base + sums[:, :, rows:]) * scale * values.scales
    return out.float().transpose(1, 2)


def one_digit_weighted_sum(weights: torch.Tensor, values: QuantizedValues) -> torch.Tensor:
    """A deliberately coarse variant: each row's weights rounded to one 8-bit digit by its own max."""
    codes, scales = quantize_rows(weights.reshape(-1, FRAMES), weight_range())
    codes = codes.view(weights.shape)
    sums = torch.stack([torch._int_mm(values.codes[h].to(torch.int8), codes[h].t()) for h in range(weights.shape[0])])
    return (sums.float() * scales.view(HEADS, 1, -1) * values.scales).transpose(1, 2)


def test_a_rows_weighted_sum_does_not_depend_on_the_call_and_a_call_wide_scale_does():
    values = quantize_values(float_values())
    weights = peaked_weights()
    assert rows_depending_on_the_call(integer_weighted_sum, weights, values) == []
    assert len(rows_depending_on_the_call(call_scale_weighted_sum, weights, values)) > weights.shape[1] // 2


def test_the_weighted_sum_is_the_stated_formula_in_float64():
    values_t = float_values(seed=11)
    quantized = quantize_values(values_t)
    weights = peaked_weights(rows=8, seed=12)
    base = weight_range() + 1
    scales = weights.double().amax(dim=-1, keepdim=True) / (base * base - 1)
    levels = torch.round(weights.double() / scales)
    assert int(levels.max()) == base * base - 1 and int(levels.min()) >= 0
    codes, channel_scales = quantize_rows(values_t.reshape(-1, FRAMES), QMAX)
    exact = levels @ codes.double().view(HEADS, HEAD_DIM, FRAMES).transpose(1, 2)  # [H, R, D]
    expected = exact * scales * channel_scales.double().view(HEADS, 1, HEAD_DIM)
    assert torch.allclose(integer_weighted_sum(weights, quantized).double(), expected, rtol=1e-5, atol=1e-6)
    assert quantized.shape == values_t.shape and quantized.codes.dtype in (torch.int8, torch.float32)


def digits_in_range(high: torch.Tensor, low: torch.Tensor, levels: torch.Tensor, base: int) -> bool:
    """Do the two digits recompose each level, each within [0, base - 1] (the kernels' weight range)?"""
    digits = torch.cat([high, low])
    return torch.equal(high * base + low, levels) and 0 <= float(digits.min()) and float(digits.max()) <= base - 1


def test_the_digits_recompose_each_level_in_both_kernels_dtypes_and_a_rounded_split_does_not():
    weights = peaked_weights(rows=8, seed=18)
    base, rows = weight_range() + 1, weights.shape[1]
    digits, scales = weight_digits(weights, base, 1e-30, torch.float32)
    levels = torch.round(weights / scales)  # the same two correctly rounded operations per element
    assert digits_in_range(digits[:, :rows], digits[:, rows:], levels, base)
    assert torch.equal(weight_digits(weights, base, 1e-30, torch.int8)[0], digits.to(torch.int8))
    rounded = torch.round(levels / base)  # the control: a high digit rounded, not floored
    assert not digits_in_range(rounded, levels - rounded * base, levels, base)  # some low digits < 0


def test_the_weighted_sum_stays_close_to_float_and_one_digit_weights_do_worse():
    values_t = float_values(seed=13)
    quantized = quantize_values(values_t)
    weights = peaked_weights(seed=14)
    exact = weights @ values_t.transpose(1, 2)
    spread = values_t.abs().amax(dim=-1).unsqueeze(1)  # [H, 1, D]: each channel's range

    def error(result: torch.Tensor) -> float:
        return float(((result - exact).abs() / spread).max())

    two_digits = error(integer_weighted_sum(weights, quantized))
    assert two_digits < 0.01  # within a percent of each channel's range: the values' own rounding
    assert error(one_digit_weighted_sum(weights, quantized)) > 2 * two_digits


def test_attend_all_with_integer_values_is_a_rows_own_and_near_float():
    keys = keys_with_a_shared_offset(seed=15)
    values_t = float_values(seed=16)
    queries = spread_queries(rows=16, seed=17) * 0.03
    memory = (quantize_keys(keys), quantize_values(values_t))
    integer = attend_all(queries, *memory, scale=1.0)
    alone = torch.cat([attend_all(queries[:, at : at + 1], *memory, scale=1.0) for at in range(16)])
    assert torch.equal(integer, alone)
    floating = attend_all(queries, keys, values_t, scale=1.0)
    assert float((integer - floating).abs().max()) < 0.05 * float(values_t.abs().max())
