"""The kernels an AVX2-only CPU runs fast: FBGEMM's int8 GEMM for the linears
(models/int8_fbgemm.py) and fp32 products of integer codes for the int8 cross-attention
(models/int8_attention.py). Each gives `torch._int_mm`'s integers bitwise: FBGEMM at every depth
and row count, with signed and with non-negative inputs; the float kernel wherever its sums stay
below 2^24. A copy re-packs; targets whose linears all run on FBGEMM pass the self-test and
speculate exactly. Controls: a FBGEMM that saturates u8 x s8 pairs in int16 (as AVX2's
vpmaddubsw does at 8-bit weights) fails the exactness probe, is never offered, and makes the
weights 7-bit; fp32 products past 2^24 are not exact, and that kernel is then not offered."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncspec.models import int8_attention, int8_fbgemm, int8_linear
from asyncspec.models.int8_attention import (
    float_sums_exact,
    integer_scores,
    integer_weighted_sum,
    quantize_keys,
    quantize_values,
)
from asyncspec.models.int8_linear import (
    QMAX,
    REDUCED_WEIGHT_QMAX,
    Int8Linear,
    measured_layout,
    prepacked_exact,
    products_exact,
    quantize_rows,
    shared_input,
    weight_range,
)
from asyncspec.models.selftest import check_invariance
from conftest import synthetic_speech, tiny_whisper
from test_int8_packed import assert_targets_in_layout_are_exact

pytestmark = pytest.mark.skipif(not int8_fbgemm.available(), reason="this torch build has no FBGEMM")


def extreme_codes(rows: int, columns: int, largest: int, seed: int = 0, low: int | None = None) -> torch.Tensor:
    """int8 [rows, columns] in [low, largest] (default [-largest, largest]), the first row at +largest
    throughout and the second at its lowest: the largest sums a kernel must add."""
    low = -largest if low is None else low
    codes = torch.randint(low, largest + 1, (rows, columns), generator=torch.Generator().manual_seed(seed))
    codes[0] = largest
    codes[1:2] = low
    return codes.to(torch.int8)


@pytest.mark.parametrize("depth", [64, 512, 2048])
@pytest.mark.parametrize("rows", [1, 8, 13, 64])
def test_fbgemm_sums_are_int_mms_converted_to_fp32(depth, rows):
    weight = extreme_codes(96, depth, weight_range(), seed=depth)
    x = extreme_codes(rows, depth, QMAX, seed=rows)
    exact = torch._int_mm(x, weight.t().contiguous())
    assert torch.equal(exact.double(), x.double() @ weight.double().t())
    assert torch.equal(int8_fbgemm.FbgemmProducts(weight)(x), exact.float())
    assert prepacked_exact("fbgemm", depth)


def test_non_negative_inputs_without_zero_point_take_full_range_weights():
    """The cross-attention weights' digits (0..weight range) against full-range value codes."""
    values = extreme_codes(64, 1500, QMAX, seed=3)
    digits = extreme_codes(16, 1500, weight_range(), seed=4, low=0)
    exact = digits.double() @ values.double().t()
    assert torch.equal(int8_fbgemm.FbgemmProducts(values, zero_point=0)(digits).double(), exact.float().double())


def test_a_copy_repacks_and_computes_alike():
    weight, bias = torch.randn(40, 300), torch.randn(40)
    layer = Int8Linear(weight, bias, "fbgemm")
    twin = copy.deepcopy(layer)
    assert twin.prepacked is not layer.prepacked and twin.prepacked.packed is not layer.prepacked.packed
    x = torch.randn(8, 300)
    assert torch.equal(twin(x), layer(x)) and torch.equal(layer(x), Int8Linear(weight, bias, "nk")(x))


def test_fbgemm_reads_fp32_codes_and_gives_the_bits_of_int8_codes():
    weight, bias = torch.randn(48, 512), torch.randn(48)
    fbgemm, nk = Int8Linear(weight, bias, "fbgemm"), Int8Linear(weight, bias, "nk")
    assert fbgemm.codes_dtype == torch.float32 and nk.codes_dtype == torch.int8
    x = torch.randn(5, 512) * torch.tensor([1e-3, 1.0, 30.0, 1e4, 0.2]).view(5, 1)
    as_int8 = fbgemm.from_quantized(*quantize_rows(x))  # what every linear computed before
    assert torch.equal(fbgemm(x), as_int8) and torch.equal(fbgemm(x), nk(x))
    shared = shared_input([fbgemm, Int8Linear(weight, bias, "fbgemm")], x)  # one fp32 quantization
    assert all(torch.equal(y, as_int8) for y in shared)
    mixed = shared_input([fbgemm, nk], x)  # a group with an int8 kernel quantizes to int8 for all
    assert all(torch.equal(y, as_int8) for y in mixed)
    # the control: codes left unrounded are quantized by FBGEMM itself, and the bits move
    codes, scale = quantize_rows(x, codes=torch.float32)
    unrounded = x / scale
    assert not torch.equal(fbgemm.from_quantized(unrounded + 0.3, scale), as_int8)
    assert torch.equal(fbgemm.from_quantized(codes, scale), as_int8)


def saturating_call(self, x_q: torch.Tensor) -> torch.Tensor:
    """FBGEMM as AVX2's vpmaddubsw works: shifted u8 x s8 products added in int16 pairs, saturating."""
    shifted = x_q.int() + self.zero_point
    weight = self.quantized.int()
    products = shifted.unsqueeze(2) * weight.t().unsqueeze(0)
    pairs = products.reshape(shifted.shape[0], -1, 2, products.shape[2]).sum(dim=2).clamp(-32768, 32767)
    return (pairs.sum(dim=1) - self.zero_point * weight.sum(dim=1)).float()


def test_a_saturating_fbgemm_is_caught_never_offered_and_makes_the_weights_7_bit(monkeypatch):
    monkeypatch.setattr(int8_linear, "_PREPACKED_EXACT", {})
    monkeypatch.setattr(int8_linear, "_LAYOUTS", {})
    monkeypatch.setattr(int8_linear, "_WEIGHT_RANGE", [])
    monkeypatch.setattr(int8_fbgemm.FbgemmProducts, "__call__", saturating_call)
    assert weight_range() == REDUCED_WEIGHT_QMAX  # 2 * 255 * 63 fits int16: exact again
    assert products_exact(256, 96, kernels=("fbgemm",))
    assert not products_exact(256, 96, weight_max=QMAX, kernels=("fbgemm",))
    monkeypatch.setattr(int8_linear, "_WEIGHT_RANGE", [QMAX])  # control: full-range weights
    assert not prepacked_exact("fbgemm", 256)
    assert measured_layout(torch.ones(96, 256, dtype=torch.int8))[0] != "fbgemm"
    monkeypatch.setattr(int8_linear, "_PREPACKED_EXACT", {("fbgemm", 256, QMAX): True})
    assert not products_exact(256, 96)  # while offered, the default check covers it


def test_where_this_cpus_fbgemm_saturates_the_probe_says_so_and_the_weights_are_7_bit():
    """The real kernel, not an emulation: on a CPU without VNNI FBGEMM pairs products in int16."""
    if products_exact(512, 64, weight_max=QMAX, kernels=("fbgemm",)):
        assert weight_range() == QMAX or not products_exact(512, 64, weight_max=QMAX, kernels=("kn", "nk"))
        pytest.skip("FBGEMM is exact at 8-bit weights on this CPU (VNNI): nothing saturates")
    assert weight_range() == REDUCED_WEIGHT_QMAX
    assert products_exact(512, 64, kernels=("fbgemm",))


def test_fbgemm_int8_targets_pass_the_self_test_and_speculate_exactly(monkeypatch):
    assert prepacked_exact("fbgemm", 64)
    monkeypatch.setattr(int8_linear, "measured_layout", lambda quantized: ("fbgemm", None))
    assert_targets_in_layout_are_exact("fbgemm", seed=23)


def attention_inputs(frames: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(6, frames, 64, generator=generator) + 3.0 * torch.randn(6, 1, 64, generator=generator)
    values_t = torch.randn(6, 64, frames, generator=generator)
    queries = torch.randn(6, 8, 64, generator=generator)
    weights = torch.softmax(4.0 * torch.randn(6, 8, frames, generator=generator), dim=-1)
    return keys, values_t, queries, weights


@pytest.mark.parametrize("weights_range", [REDUCED_WEIGHT_QMAX, QMAX])
def test_float_and_int_mm_attention_kernels_give_the_same_bits(monkeypatch, weights_range):
    monkeypatch.setattr(int8_linear, "_WEIGHT_RANGE", [weights_range])
    keys, values_t, queries, weights = attention_inputs(1500, seed=weights_range)
    results = {}
    for faster in (True, False):
        monkeypatch.setattr(int8_attention, "float_products_faster", lambda *shape, faster=faster: faster)
        quantized_keys, quantized_values = quantize_keys(keys), quantize_values(values_t)
        results[faster] = (integer_scores(queries, quantized_keys), integer_weighted_sum(weights, quantized_values))
        kinds = (quantized_keys.codes.dtype, quantized_values.codes.dtype)
        results[faster, "dtypes"] = kinds
    assert results[False, "dtypes"] == (torch.int8, torch.int8)
    # the scores' sums (64 * 127 * range) are always below 2^24; the weighted sums' only with 7-bit digits
    float_values = torch.float32 if weights_range == REDUCED_WEIGHT_QMAX else torch.int8
    assert results[True, "dtypes"] == (torch.float32, float_values)
    assert torch.equal(results[True][0], results[False][0]) and torch.equal(results[True][1], results[False][1])


def test_fp32_products_past_2_to_the_24_are_not_exact_and_are_not_offered():
    """Control for the bound: 1,500 frames of full-range values against 8-bit digits."""
    values = extreme_codes(64, 1500, QMAX, seed=5)
    values[0, 0] = QMAX - 1  # row 0's sum against all-127 digits: 127 * (127 * 1499 + 126), odd
    digits = extreme_codes(16, 1500, QMAX, seed=6, low=0)
    exact = digits.double() @ values.double().t()
    assert exact[0, 0] > 1 << 24 and exact[0, 0] % 2 == 1  # no fp32 holds it: a float kernel must round
    assert not torch.equal((digits.float() @ values.float().t()).double(), exact)
    assert not float_sums_exact(1500, QMAX, QMAX)
    assert float_sums_exact(1500, QMAX, REDUCED_WEIGHT_QMAX) and float_sums_exact(64, QMAX, QMAX)
    seven_bit = extreme_codes(16, 1500, REDUCED_WEIGHT_QMAX, seed=6, low=0)
    assert torch.equal((seven_bit.float() @ values.float().t()).double(), seven_bit.double() @ values.double().t())


def test_a_lowered_fp32_matmul_precision_turns_the_float_kernel_off():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # may run fp32 products in bf16
        assert not float_sums_exact(64, QMAX, QMAX)
    finally:
        torch.set_float32_matmul_precision(before)
    assert float_sums_exact(64, QMAX, QMAX)


def test_the_int8_whisper_engine_on_the_float_attention_kernel_passes_the_self_test(monkeypatch):
    monkeypatch.setattr(int8_attention, "float_products_faster", lambda *shape: True)
    target = tiny_whisper("int8", seed=25)
    speech = synthetic_speech(2.0, seed=25)
    state = target.prefill(target.request(speech, max_new_tokens=8), target.encode_audio(speech))
    assert all(keys.codes.dtype == torch.float32 for keys, _ in state.cache.cross)
    assert check_invariance(target).passed
