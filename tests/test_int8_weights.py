"""A prepared model's int8 weights are quantized once and read back from the per-machine cache
(models/int8_weights.py): the kept weights are bitwise the weights quantized now, and decode to
the same logits; a re-prepared or edited model file gets a new entry; a damaged entry is
quantized again. The control: an entry edited in place is read as it stands, so the tests that
compare against fresh quantization would see a stale entry. Building Whisper skips the random
fills that the load overwrites, and leaves `torch.nn.init` as it found it."""

from __future__ import annotations

import os

import pytest
import torch

from asyncspec.models import int8_linear, int8_weights, whisper_model
from asyncspec.models.base import DecodeRequest
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.models.int8_linear import Int8Linear, quantize_rows, weight_range
from asyncspec.models.int8_weights import cache_path, quantized_weights, weights_identity
from conftest import real_model_dir


@pytest.fixture
def model(tmp_path, monkeypatch):
    """whisper-tiny.en's prepared folder, reached through a cache of the test's own."""
    prepared = real_model_dir("whisper-tiny.en")
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    linked = tmp_path / "models" / "whisper-tiny.en"
    linked.symlink_to(prepared, target_is_directory=True)
    return linked


def _int8_weights(backend) -> dict[str, torch.Tensor]:
    layers = {name: m for name, m in backend._decoder_layers().named_modules() if isinstance(m, Int8Linear)}
    layers["<output>"] = backend.output_int8
    return {f"{name}.{kind}": getattr(m, kind) for name, m in layers.items() for kind in ("weight_q", "weight_scale")}


def _load(model) -> WhisperBackend:
    return WhisperBackend.load(model, "whisper-tiny.en", torch.float32, encoder="fp32", int8=True)


def _first_logits(backend) -> torch.Tensor:
    state = backend.prefill(DecodeRequest(tuple(backend.prompt_ids())), backend.probe_context())
    return backend.extend(state, [backend.tokenizer.encode(" Hello")[0]])


@pytest.mark.real
def test_kept_int8_weights_are_the_weights_quantized_now(model, monkeypatch):
    fresh = _load(model)  # quantizes, and keeps the result
    entry = cache_path(weights_identity(model), weight_range())
    assert entry.is_file()

    def refused(*args, **kwargs):
        raise AssertionError("quantized again although the weights were kept")

    with monkeypatch.context() as patched:  # the load alone: activations are quantized per call
        patched.setattr(int8_weights, "quantize_rows", refused)
        patched.setattr(int8_linear, "quantize_rows", refused)
        kept = _load(model)
    for name, tensor in _int8_weights(fresh).items():
        assert torch.equal(tensor, _int8_weights(kept)[name]), name
    assert torch.equal(_first_logits(fresh), _first_logits(kept))


@pytest.mark.real
def test_an_edited_model_file_gets_new_int8_weights_and_an_edited_entry_is_read_as_it_stands(model):
    reference = _int8_weights(_load(model))
    entry = cache_path(weights_identity(model), weight_range())
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(entry))
    tensors["layers.0.fc1.q"] = -tensors["layers.0.fc1.q"]
    save_file(tensors, str(entry))
    # the control: the entry is trusted as it stands, so a stale one would be caught by comparing
    stale = _int8_weights(_load(model))
    assert not torch.equal(stale["layers.0.fc1.weight_q"], reference["layers.0.fc1.weight_q"])
    # the model file touched (as a re-prepare writes it): a new identity, quantized afresh
    weights = model / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        assert cache_path(weights_identity(model), weight_range()) != entry
        renewed = _int8_weights(_load(model))
        assert not entry.exists()  # the superseded entry is removed, not left to fill the disk
    finally:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    for name, tensor in reference.items():
        assert torch.equal(tensor, renewed[name]), name


def test_a_damaged_or_mismatched_entry_is_quantized_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    generator = torch.Generator().manual_seed(1)
    weights = {"a": torch.randn(16, 8, generator=generator), "b": torch.randn(4, 8, generator=generator)}
    identity = {"path": "/nowhere/model.safetensors", "sha256": None, "bytes": 1, "mtime_ns": 1}
    expected = {name: quantize_rows(w, 127) for name, w in weights.items()}
    entry = cache_path(identity, 127)
    for damage in (b"", b"not a safetensors file", None):
        if damage is None:  # a well-formed entry for other shapes
            quantized_weights({"a": torch.randn(3, 8), "b": torch.randn(4, 8)}, 127, identity)
        else:
            entry.parent.mkdir(parents=True, exist_ok=True)
            entry.write_bytes(damage)
        got = quantized_weights(weights, 127, identity)
        for name, (q, scale) in expected.items():
            assert torch.equal(got[name][0], q) and torch.equal(got[name][1], scale), (damage, name)
        again = quantized_weights(weights, 127, identity)  # the entry was replaced by a good one
        assert torch.equal(again["a"][0], expected["a"][0])
    assert cache_path(identity, 63) != entry  # 7-bit weights (a CPU without VNNI) are kept apart


def test_a_model_without_a_file_is_quantized_each_time(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    assert weights_identity(tmp_path) is None
    quantized_weights({"a": torch.randn(4, 8)}, 127, None)
    assert not (tmp_path / "int8-weights").exists()


@pytest.mark.real
def test_building_whisper_skips_the_random_fills_and_restores_them(model):
    fills = {name: getattr(torch.nn.init, name) for name in ("kaiming_uniform_", "uniform_", "normal_")}
    loaded = whisper_model.load_whisper(model, torch.float32)
    assert {name: getattr(torch.nn.init, name) for name in fills} == fills
    torch.manual_seed(0)
    assert torch.nn.Linear(8, 8).weight.abs().sum() > 0  # filled again after the load
    with whisper_model._initialisation_skipped():
        torch.nn.init.normal_(probe := torch.zeros(4))
    assert not probe.any()  # the fill did nothing inside
    assert loaded.model.decoder.layers[0].fc1.weight.abs().sum() > 0
