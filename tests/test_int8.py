"""The int8 engine (models/int8_linear.py): every output row is a function of its input row alone,
the integer products are exact, the dequantized result is the formula it claims (checked in
float64), and speculative output equals target-only output with int8 targets. Negative controls:
per-tensor quantization (a hand-written one and torch's `quantize_dynamic`) makes rows depend on
the call, and a kernel that saturates products in int16 pairs is caught by the exactness check."""

from __future__ import annotations

import argparse
import json
import warnings

import pytest
import torch

from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models import int8_linear
from asyncspec.models.base import DecodeRequest
from asyncspec.models.encoder_placement import place
from asyncspec.models.hf_causal import CausalLMBackend
from asyncspec.models.int8_linear import (
    QMAX,
    REDUCED_WEIGHT_QMAX,
    Int8Linear,
    measured_layout,
    products_exact,
    quantize_rows,
    remember_layout,
    remembered_layouts,
)
from asyncspec.models.selftest import check_invariance, inexact_int8_shapes
from conftest import synthetic_speech, tiny_causal, tiny_whisper, word_tokenizer


def rows_depending_on_the_call(layer, x: torch.Tensor, widths=(1, 3, 8, 16)) -> list[int]:
    """Rows whose output differs between the whole call and calls of each width."""
    whole = layer(x)
    differing = set()
    for width in widths:
        parts = torch.cat([layer(x[i : i + width]) for i in range(0, len(x), width)])
        differing |= {i for i in range(len(x)) if not torch.equal(parts[i], whole[i])}
    return sorted(differing)


class PerTensorInt8Linear(torch.nn.Module):
    """A deliberately wrong quantizer: one activation scale for the whole call."""

    def __init__(self, layer: Int8Linear):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        scale = x.abs().amax().clamp(min=1e-30) / QMAX
        x_q = torch.round(x / scale).clamp(-QMAX, QMAX).to(torch.int8)
        return self.layer.integer_products(x_q).float() * scale * self.layer.weight_scale + self.layer.bias


def spread_rows(rows: int = 40, features: int = 64) -> torch.Tensor:
    """Rows whose magnitudes differ by 100x, as activations do (so a shared scale matters)."""
    generator = torch.Generator().manual_seed(3)
    return torch.randn(rows, features, generator=generator) * torch.logspace(-1, 1, rows).unsqueeze(1)


def test_int8_rows_do_not_depend_on_the_call_and_per_tensor_scales_do():
    linear = torch.nn.Linear(64, 96)
    layer = Int8Linear.from_linear(linear)
    x = spread_rows()
    assert rows_depending_on_the_call(layer, x) == []
    assert len(rows_depending_on_the_call(PerTensorInt8Linear(layer), x)) > 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated; it is the control here
        dynamic = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear}, torch.qint8)
        assert len(rows_depending_on_the_call(dynamic, x)) > 10


def test_int8_output_is_the_stated_formula_in_float64_and_close_to_float():
    linear = torch.nn.Linear(64, 96)
    layer = Int8Linear.from_linear(linear)
    x = spread_rows()
    w = linear.weight.detach().double()
    w_max = int8_linear.weight_range()
    w_scale = w.abs().amax(dim=1) / w_max
    w_q = torch.round(w / w_scale[:, None]).clamp(-w_max, w_max)
    x_scale = x.double().abs().amax(dim=1, keepdim=True) / QMAX
    x_q = torch.round(x.double() / x_scale).clamp(-QMAX, QMAX)
    reference = (x_q @ w_q.t()) * x_scale * w_scale + linear.bias.detach().double()
    assert torch.allclose(layer(x).double(), reference, rtol=1e-5, atol=1e-6)
    exact = linear(x).detach()
    relative = (layer(x) - exact).norm(dim=1) / exact.norm(dim=1)
    assert relative.max() < 0.03  # int8 at 64 inputs: about 1 % per row


def test_quantized_rows_and_layouts():
    x = spread_rows(8)
    x_q, scale = quantize_rows(x)
    assert x_q.dtype == torch.int8 and x_q.abs().max() == QMAX and scale.shape == (8, 1)
    zeros_q, _ = quantize_rows(torch.zeros(2, 16))
    assert torch.equal(zeros_q, torch.zeros(2, 16, dtype=torch.int8))  # no NaN from a zero row
    weight = torch.randn(96, 64)
    layouts = ("kn", "nk", *(("fbgemm",) if int8_linear.prepacked_exact("fbgemm", 64) else ()))
    outputs = [Int8Linear(weight, None, layout)(x) for layout in layouts]
    assert all(torch.equal(output, outputs[0]) for output in outputs)  # the layout is a speed choice only
    assert measured_layout(torch.zeros(96, 64, dtype=torch.int8))[0] in (*layouts, "packed")


def saturating_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A kernel as AVX2's vpmaddubsw path works: the signed input shifted to unsigned (a + 128),
    products added in int16 pairs with saturation, the shift's compensation subtracted after."""
    shifted = a.int() + 128
    products = shifted.unsqueeze(2) * b.int().unsqueeze(0)  # [M, K, N]
    pairs = products.reshape(a.shape[0], -1, 2, b.shape[1]).sum(dim=2).clamp(-32768, 32767)
    return (pairs.sum(dim=1) - 128 * b.int().sum(dim=0)).int()


def test_integer_products_are_exact_here_and_a_saturating_kernel_is_caught():
    assert products_exact(64, 96)
    assert not products_exact(64, 96, matmul=saturating_int_mm, weight_max=QMAX)
    assert products_exact(64, 96, matmul=saturating_int_mm, weight_max=REDUCED_WEIGHT_QMAX)


def test_a_saturating_cpu_gets_7_bit_weights_whose_products_are_exact(monkeypatch):
    monkeypatch.setattr(int8_linear, "_WEIGHT_RANGE", [])
    monkeypatch.setattr(int8_linear.torch, "_int_mm", saturating_int_mm)
    assert int8_linear.weight_range() == REDUCED_WEIGHT_QMAX
    layer = Int8Linear(torch.randn(96, 64), None)
    assert layer.weight_q.abs().max() == REDUCED_WEIGHT_QMAX and products_exact(64, 96)
    assert rows_depending_on_the_call(layer, spread_rows()) == []


def test_self_test_fails_an_int8_target_whose_products_are_inexact(monkeypatch):
    target = tiny_causal("int8", seed=8)
    assert inexact_int8_shapes(target) == [] and check_invariance(target).passed
    monkeypatch.setattr(int8_linear, "_WEIGHT_RANGE", [QMAX])  # full-range weights on a saturating kernel
    monkeypatch.setattr("asyncspec.models.int8_linear.torch._int_mm", saturating_int_mm)
    report = check_invariance(target)
    assert not report.passed and "int8 products are not exact" in report.first_difference


def test_int8_targets_report_their_precision_and_keep_float_layers():
    for target in (tiny_causal("int8", seed=9), tiny_whisper("int8", seed=9)):
        assert target.precision == "int8" and target.dtype == torch.float32
        assert check_invariance(target).dtype == "int8"
        linears = [m for m in target._decoder_layers().modules() if isinstance(m, torch.nn.Linear)]
        assert linears == []  # every decoder linear replaced
    with pytest.raises(ValueError, match="quantized from an fp32 model"):
        CausalLMBackend(tiny_causal(torch.bfloat16).model, word_tokenizer(), "bf16", frozenset({95}), int8=True)


@pytest.mark.parametrize("method", ["sd", "specasr"])
def test_speculative_methods_equal_target_only_on_int8_targets(method):
    target = tiny_causal("int8", seed=10)
    drafter = tiny_causal(torch.float32, seed=11, engine="transformers")
    request = DecodeRequest((5, 9, 14, 2), max_new_tokens=40)
    config = DecodeConfig()
    reference = METHODS["target"](target, None, request, config).tokens
    assert METHODS[method](target, drafter, request, config).tokens == reference
    whisper = tiny_whisper("int8", seed=10)
    speech = whisper.request(synthetic_speech(2.0, seed=10), max_new_tokens=30)
    whisper_drafter = tiny_whisper(torch.float32, seed=10, engine="transformers")
    expected = METHODS["target"](whisper, None, speech, config).tokens
    assert METHODS[method](whisper, whisper_drafter, speech, config).tokens == expected


def test_an_int8_encoder_stays_int8_and_matches_its_copy():
    whisper = tiny_whisper(torch.float32, seed=12)
    encoder = whisper.model.model.encoder
    features = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(1))
    place(encoder, "int8")
    assert any(isinstance(m, Int8Linear) for m in encoder.modules())
    with torch.inference_mode():
        first = encoder(features).last_hidden_state
        assert torch.equal(first, encoder(features).last_hidden_state)
    with pytest.raises(ValueError, match="int8 already"):
        place(encoder, "fp32")


def test_dtype_auto_is_measured_cached_and_refuses_inexact_int8(tmp_path, monkeypatch):
    from asyncspec.models import precision_choice

    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path / "cache"))
    config = {"model_type": "whisper", "d_model": 64, "decoder_ffn_dim": 256, "decoder_layers": 2, "vocab_size": 900}
    (tmp_path / "config.json").write_text(__import__("json").dumps(config))
    assert len(precision_choice.linear_shapes(config)) == 2 * 8 + 1
    first = precision_choice.choose_precision(tmp_path)
    assert not first.cached and first.int8_exact and set(first.measured_ms) == {"int8", "bf16", "fp32"}
    assert first.dtype == min(first.measured_ms, key=first.measured_ms.get)
    again = precision_choice.choose_precision(tmp_path)
    assert again.cached and again.dtype == first.dtype and "dtype auto" in again.summary()
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path / "other"))
    monkeypatch.setattr(precision_choice, "products_exact", lambda k, n: False)  # neither range is exact
    refused = precision_choice.choose_precision(tmp_path)
    floats = {k: v for k, v in refused.measured_ms.items() if k != "int8"}
    assert refused.dtype == min(floats, key=floats.get) and "not exact" in refused.summary()


def dtype_defaults(parser, path=()) -> dict[tuple[str, ...], object]:
    """Every (sub)command that takes --dtype, with its default."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= dtype_defaults(sub, (*path, name))
        elif "--dtype" in action.option_strings:
            found[path] = sub_default if (sub_default := parser.get_default("dtype")) is not None else action.default
    return found


# bench cloudedge's and bench correction's --dtype stay unset until the pair is known: the tiny pair
# runs fp32, the Qwen pair the precision auto measures (cloudedge resolves it once for every process)
RESOLVED_LATER = {("bench", "cloudedge"), ("bench", "correction")}


def test_every_model_command_defaults_to_the_precision_measured_on_this_cpu():
    """#28: a CPU without native bf16 (bf16 emulated: 4.7x fp32 at a 64-row call on an AVX2 Zen 3)
    gets the fastest exact precision from the defaults, not bf16."""
    from asyncspec.cli import build_parser

    defaults = dtype_defaults(build_parser())
    assert {("serve", "cloud"), ("serve", "edge"), ("generate",), ("transcribe",), ("profile",)} <= set(defaults)
    wrong = {" ".join(path): d for path, d in defaults.items() if d != "auto" and path not in RESOLVED_LATER}
    assert wrong == {}, f"commands whose --dtype default is not auto: {wrong}"
    assert all(defaults[path] is None for path in RESOLVED_LATER)


def test_generate_says_which_precision_auto_chose_and_computes_in_it(tmp_path, capsys):
    from asyncspec.benchmarks.tiny_pair import save_tiny_pair
    from asyncspec.cli import main
    from asyncspec.models.precision_choice import choose_precision

    target_dir, _ = save_tiny_pair(tmp_path)
    chosen = choose_precision(target_dir).dtype
    tokens, said = {}, {}
    for name, dtype in (("default", []), ("explicit", ["--dtype", chosen])):
        out = tmp_path / f"{name}.json"
        argv = [
            "generate",
            "--model",
            str(target_dir),
            "--prompt",
            "w3 w4 w5",
            "--max-new-tokens",
            "8",
            "--json",
            str(out),
        ]
        assert main([*argv, *dtype]) == 0
        tokens[name] = json.loads(out.read_text())["records"][0]["token_ids"]
        said[name] = capsys.readouterr().err
    assert f"loaded {target_dir} {chosen}; dtype auto: {chosen} (" in said["default"], said["default"]
    assert f"loaded {target_dir} {chosen}" in said["explicit"] and "dtype auto" not in said["explicit"]
    assert tokens["default"] == tokens["explicit"] and len(tokens["default"]) == 8


def test_a_measured_layout_is_remembered_per_machine_and_a_remembered_one_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(int8_linear, "_LAYOUTS", {})
    weight = torch.randint(-63, 64, (96, 256), generator=torch.Generator().manual_seed(3), dtype=torch.int8)
    first, _ = measured_layout(weight)
    assert remembered_layouts() == {"96x256": first}

    def timed_again(run):
        raise AssertionError("timed again")

    monkeypatch.setattr(int8_linear, "_LAYOUTS", {})  # a new process
    monkeypatch.setattr(int8_linear, "seconds_of_three", timed_again)
    assert measured_layout(weight)[0] == first  # read, not timed
    # controls: a remembered prepacked layout whose exactness probe fails here, and a damaged
    # entry, are timed again, never used
    monkeypatch.setattr(int8_linear, "_LAYOUTS", {})
    remember_layout("96x256", "fbgemm")
    monkeypatch.setattr(int8_linear, "prepacked_exact", lambda layout, k: False)
    with pytest.raises(AssertionError, match="timed again"):
        measured_layout(weight)
    int8_linear._layouts_file().write_text("{damaged")
    assert remembered_layouts() == {}
