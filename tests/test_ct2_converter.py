"""The CTranslate2 -> transformers Whisper converter: file format, name mapping, real models."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.ct2_whisper import ConversionError, ct2_to_hf_state_dict, read_ct2_variables
from asyncspec.models.registry import load_decoder
from conftest import tiny_whisper

REFERENCE = Path(__file__).parent / "data" / "ct2_reference_tokens.json"
_CODES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_ct2(path: Path, variables: dict[str, np.ndarray], aliases: dict[str, str], spec: str = "WhisperSpec") -> None:
    """The inverse of the reader, for tests: version 6 header, variables, aliases."""
    out = struct.pack("<I", 6) + _string(spec) + struct.pack("<II", 1, len(variables))
    for name, array in variables.items():
        out += _string(name) + struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape)
        out += struct.pack("<BI", _CODES[array.dtype], array.nbytes) + array.tobytes()
    out += struct.pack("<I", len(aliases)) + b"".join(_string(a) + _string(t) for a, t in aliases.items())
    path.write_bytes(out)


def _ct2_variables_of(model) -> dict[str, np.ndarray]:
    """A CTranslate2-style variable set built from a transformers Whisper (the converter's inverse)."""
    state = {k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()}
    config = model.config
    variables = {
        "encoder/num_heads": np.array(config.encoder_attention_heads, np.int16),
        "decoder/num_heads": np.array(config.decoder_attention_heads, np.int16),
    }
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        hf = f"model.{side}"
        variables[f"{side}/position_encodings/encodings"] = state[f"{hf}.embed_positions.weight"]
        variables[f"{side}/layer_norm/gamma"] = state[f"{hf}.layer_norm.weight"]
        variables[f"{side}/layer_norm/beta"] = state[f"{hf}.layer_norm.bias"]
        for i in range(layers):
            _layer(variables, state, side, i)
    for conv in ("conv1", "conv2"):
        for kind in ("weight", "bias"):
            variables[f"encoder/{conv}/{kind}"] = state[f"model.encoder.{conv}.{kind}"]
    variables["decoder/embeddings/weight"] = state["model.decoder.embed_tokens.weight"]
    return variables


def _layer(variables, state, side, i):
    hf, ct = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
    attn = f"{hf}.self_attn"
    zeros = np.zeros_like(state[f"{attn}.q_proj.bias"])
    variables[f"{ct}/self_attention/linear_0/weight"] = np.concatenate(
        [state[f"{attn}.{p}_proj.weight"] for p in "qkv"]
    )
    variables[f"{ct}/self_attention/linear_0/bias"] = np.concatenate(
        [state[f"{attn}.q_proj.bias"], zeros, state[f"{attn}.v_proj.bias"]]
    )
    _copy(variables, state, f"{ct}/self_attention/linear_1", f"{attn}.out_proj")
    _copy(variables, state, f"{ct}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm", norm=True)
    _copy(variables, state, f"{ct}/ffn/linear_0", f"{hf}.fc1")
    _copy(variables, state, f"{ct}/ffn/linear_1", f"{hf}.fc2")
    _copy(variables, state, f"{ct}/ffn/layer_norm", f"{hf}.final_layer_norm", norm=True)
    if side == "decoder":
        cross = f"{hf}.encoder_attn"
        _copy(variables, state, f"{ct}/attention/linear_0", f"{cross}.q_proj")
        variables[f"{ct}/attention/linear_1/weight"] = np.concatenate(
            [state[f"{cross}.k_proj.weight"], state[f"{cross}.v_proj.weight"]]
        )
        variables[f"{ct}/attention/linear_1/bias"] = np.concatenate([zeros, state[f"{cross}.v_proj.bias"]])
        _copy(variables, state, f"{ct}/attention/linear_2", f"{cross}.out_proj")
        _copy(variables, state, f"{ct}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm", norm=True)


def _copy(variables, state, ct, hf, norm=False):
    names = (("gamma", "weight"), ("beta", "bias")) if norm else (("weight", "weight"), ("bias", "bias"))
    for ct_kind, hf_kind in names:
        variables[f"{ct}/{ct_kind}"] = state[f"{hf}.{hf_kind}"]


def test_round_trip_through_the_file_format(tmp_path):
    model = tiny_whisper().model
    variables = _ct2_variables_of(model)
    write_ct2(tmp_path / "model.bin", variables, {"decoder/projection/weight": "decoder/embeddings/weight"})
    read = read_ct2_variables(tmp_path / "model.bin")
    assert read["decoder/projection/weight"] is read["decoder/embeddings/weight"]
    converted = ct2_to_hf_state_dict(read)
    expected = model.state_dict()
    assert set(converted) == set(expected)
    for name, array in converted.items():
        assert np.array_equal(array, expected[name].numpy().astype(np.float16)), name


def test_bf16_variables_are_widened(tmp_path):
    values = np.array([1.5, -2.25, 3.0e-3], np.float32)
    high_halves = (values.view(np.uint32) >> 16).astype(np.uint16)
    raw = struct.pack("<I", 6) + _string("WhisperSpec") + struct.pack("<II", 1, 1)
    raw += (
        _string("x")
        + struct.pack("<BI", 1, 3)
        + struct.pack("<BI", 5, 6)
        + high_halves.tobytes()
        + struct.pack("<I", 0)
    )
    (tmp_path / "m.bin").write_bytes(raw)
    read = read_ct2_variables(tmp_path / "m.bin")["x"]
    assert read.dtype == np.float32
    assert np.allclose(read, values, rtol=1e-2)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b[:4] + _string("TransformerSpec") + b[4 + 14 :], "WhisperSpec"),
    ],
)
def test_malformed_files_are_rejected(tmp_path, mutate, message):
    write_ct2(tmp_path / "ok.bin", {"a/weight": np.ones((4, 4), np.float16)}, {})
    (tmp_path / "bad.bin").write_bytes(mutate((tmp_path / "ok.bin").read_bytes()))
    with pytest.raises(ConversionError, match=message):
        read_ct2_variables(tmp_path / "bad.bin")


@pytest.mark.real
@pytest.mark.parametrize("name", ["whisper-base", "whisper-tiny.en"])
def test_converted_models_match_ctranslate2_tokens(name):
    """fp32 transformers decoding of the converted weights = CTranslate2's own greedy tokens."""
    reference = json.loads(REFERENCE.read_text())["tokens"][name]
    decoder = load_decoder(name, torch.float32, encoder="fp32")  # fp32 through and through
    for clip in librivox_clips():
        request = decoder.request(load_audio(clip.path))
        result = decode_target_only(decoder, None, request)
        assert result.tokens == reference[clip.path.name], clip.path.name
