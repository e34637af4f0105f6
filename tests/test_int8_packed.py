"""oneDNN's packed int8 kernel (models/int8_packed.py), one more layout of an int8 linear: in
chunks of depth whose shifted sums stay below 2^24 it gives torch._int_mm's sums converted to
fp32 bitwise, at every row count and depth; a copy re-packs; a target whose linears all run
packed passes the self-test and its speculative output equals target-only's. Controls: a kernel
that compensates the zero point in float (as oneDNN does) is exact in those chunks and off by one
in a deeper one, which the exactness check catches; a kernel that saturates products in int16
pairs is caught too, and then no linear is offered the packed layout."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models import int8_linear, int8_packed
from asyncspec.models.base import DecodeRequest
from asyncspec.models.int8_linear import Int8Linear, measured_layout, prepacked_exact, products_exact
from asyncspec.models.selftest import check_invariance, inexact_int8_shapes
from conftest import synthetic_speech, tiny_causal, tiny_whisper

pytestmark = pytest.mark.skipif(not int8_packed.available(), reason="this torch build has no oneDNN int8 ops")


def extreme_rows(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Inputs whose rows quantize to +-127 throughout (the largest sums) and random rows."""
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[0] = 1.0
    x[1:2] = -1.0
    return x


@pytest.mark.parametrize("k", [64, 512, 2048])  # 2048: four chunks, sums past 2^24
def test_the_packed_layout_is_bitwise_the_int_mm_layouts(k):
    assert prepacked_exact("packed", k)
    weight = torch.randn(96, k, generator=torch.Generator().manual_seed(k))
    weight[0] = 1.0  # a column of full-range weights, for the largest sums
    bias = torch.randn(96)
    layers = {layout: Int8Linear(weight, bias, layout) for layout in ("kn", "nk", "packed")}
    assert layers["packed"].prepacked is not None and layers["nk"].prepacked is None
    for rows in (1, 8, 13, 64):
        x = extreme_rows(rows, k, seed=rows)
        outputs = {layout: layer(x) for layout, layer in layers.items()}
        assert torch.equal(outputs["packed"], outputs["nk"]) and torch.equal(outputs["kn"], outputs["nk"])


def test_chunks_are_the_deepest_whose_shifted_sums_are_fp32():
    assert int8_packed.chunk_depth(127) == 512 and 512 * 255 * 127 <= 2**24 < 576 * 255 * 127
    assert int8_packed.chunk_depth(63) == 1024 and 1024 * 255 * 63 <= 2**24 < 1088 * 255 * 63


def test_a_packed_layer_copies_by_repacking():
    layer = Int8Linear(torch.randn(40, 1100), None, "packed")
    twin = copy.deepcopy(layer)
    chunks = -(-1100 // int8_packed.chunk_depth(int8_linear.weight_range()))  # 3 of 512, or 2 of 1,024 (7-bit)
    assert len(twin.prepacked.weights) == chunks and twin.prepacked.weights[0] is not layer.prepacked.weights[0]
    x = extreme_rows(8, 1100)
    assert torch.equal(twin(x), layer(x))


def chunk_weights(products: int8_packed.PackedProducts, packed) -> torch.Tensor:
    """The int8 weights [N, depth] of one of `products`' packed chunks."""
    start, end = products.bounds[[id(w) for w in products.weights].index(id(packed))]
    return products.quantized[:, start:end].int()


def float_compensated(self, shifted: torch.Tensor, packed) -> torch.Tensor:
    """oneDNN's order: the shifted sum converted to fp32, then the zero point's compensation
    subtracted (in float64 first, so only the conversion rounds)."""
    weight = chunk_weights(self, packed).double()
    total = (shifted.double() @ weight.t()).float()
    return total - (int8_packed.SHIFT * weight.sum(dim=1)).float()


def saturating_pairs(self, shifted: torch.Tensor, packed) -> torch.Tensor:
    """A kernel as AVX2's vpmaddubsw works: u8 x s8 products added in int16 pairs, saturating."""
    weight = chunk_weights(self, packed)
    products = shifted.int().unsqueeze(2) * weight.t().unsqueeze(0)
    pairs = products.reshape(shifted.shape[0], -1, 2, products.shape[2]).sum(dim=2).clamp(-32768, 32767)
    return (pairs.sum(dim=1) - int8_packed.SHIFT * weight.sum(dim=1)).float()


def test_float_compensation_is_exact_in_the_chunks_and_caught_in_a_deeper_one(monkeypatch):
    monkeypatch.setattr(int8_packed.PackedProducts, "_chunk", float_compensated)
    assert products_exact(2048, 96, kernels=("packed",))  # four chunks of 512
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (16, 2048), generator=generator, dtype=torch.int8)
    x = torch.randint(-127, 128, (8, 2048), generator=generator, dtype=torch.int8)
    weight[0], x[0] = 127, 127  # shifted sums of 255 x 127 x 2048, 2^24 to 2^26: odd ones round
    exact = torch._int_mm(x, weight.t()).float()
    assert torch.equal(int8_packed.PackedProducts(weight, 8, 127)(x), exact)
    assert not torch.equal(int8_packed.PackedProducts(weight, 8, 127, depth=2048)(x), exact)


def test_a_saturating_packed_kernel_is_caught_and_never_offered(monkeypatch):
    monkeypatch.setattr(int8_linear, "_PREPACKED_EXACT", {})
    monkeypatch.setattr(int8_linear, "_LAYOUTS", {})
    monkeypatch.setattr(int8_linear, "_WEIGHT_RANGE", [127])
    monkeypatch.setattr(int8_packed.PackedProducts, "_chunk", saturating_pairs)
    assert not products_exact(256, 96, kernels=("packed",))
    assert not prepacked_exact("packed", 256)
    assert measured_layout(torch.ones(96, 256, dtype=torch.int8))[0] in ("kn", "nk")
    monkeypatch.setattr(int8_linear, "_PREPACKED_EXACT", {("packed", 256, 127): True})
    assert not products_exact(256, 96)  # while offered, the default check covers the packed kernel


@pytest.fixture
def every_linear_packed(monkeypatch):
    """Int8 targets built with the packed layout everywhere (timing picks it only where it wins)."""
    assert prepacked_exact("packed", 64)
    monkeypatch.setattr(int8_linear, "measured_layout", lambda quantized: ("packed", None))


def test_packed_int8_targets_pass_the_self_test_and_speculate_exactly(every_linear_packed):
    assert_targets_in_layout_are_exact("packed", seed=21)


def assert_targets_in_layout_are_exact(layout: str, seed: int) -> None:
    """Tiny causal and Whisper int8 targets whose every linear runs in `layout` pass the self-test,
    and SD / SpecASR on them equal target-only (measured_layout already patched to give `layout`)."""
    config = DecodeConfig()
    causal = tiny_causal("int8", seed=seed)
    assert causal.output_int8.layout == layout and inexact_int8_shapes(causal) == []
    assert check_invariance(causal).passed
    drafter = tiny_causal(torch.float32, seed=seed + 1, engine="transformers")
    request = DecodeRequest((5, 9, 14, 2), max_new_tokens=40)
    reference = METHODS["target"](causal, None, request, config).tokens
    assert METHODS["sd"](causal, drafter, request, config).tokens == reference
    whisper = tiny_whisper("int8", seed=seed)
    assert whisper.output_int8.layout == layout and check_invariance(whisper).passed
    speech = whisper.request(synthetic_speech(2.0, seed=seed), max_new_tokens=30)
    whisper_drafter = tiny_whisper(torch.float32, seed=seed, engine="transformers")
    expected = METHODS["target"](whisper, None, speech, config).tokens
    assert METHODS["specasr"](whisper, whisper_drafter, speech, config).tokens == expected
