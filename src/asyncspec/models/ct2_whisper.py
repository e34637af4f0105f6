"""Read CTranslate2 Whisper `model.bin` files and rebuild them as transformers Whisper weights.

Format (little-endian), see shared/notes/offline-weights.md: u32 version, spec name, u32 revision,
u32 variable count, variables (name, rank, dims, dtype code, byte count, data), then (version >= 3)
aliases. Strings are u16 length + bytes, NUL-padded.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

# CTranslate2 dtype codes -> numpy dtypes; bf16 (code 5) is widened through its f32 high half.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BF16 = 5
MIN_FORMAT_VERSION = 3


class ConversionError(ValueError):
    """The file is not a CTranslate2 Whisper model this converter understands."""


def _read(f: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise ConversionError("truncated model.bin")
    return struct.unpack(fmt, raw)


def _read_string(f: BinaryIO) -> str:
    (length,) = _read(f, "<H")
    return f.read(length).rstrip(b"\0").decode("utf-8")


def _read_variable(f: BinaryIO) -> tuple[str, np.ndarray]:
    name = _read_string(f)
    (rank,) = _read(f, "<B")
    shape = _read(f, f"<{rank}I") if rank else ()
    dtype_code, nbytes = _read(f, "<BI")
    raw = f.read(nbytes)
    if len(raw) != nbytes:
        raise ConversionError(f"truncated data for {name}")
    if dtype_code == _BF16:
        array = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif dtype_code in _DTYPES:
        array = np.frombuffer(raw, _DTYPES[dtype_code])
    else:
        raise ConversionError(f"unknown dtype code {dtype_code} for {name}")
    return name, array.reshape(shape)


def read_ct2_variables(path: Path) -> dict[str, np.ndarray]:
    """All variables of a CTranslate2 model.bin, aliases resolved."""
    with open(path, "rb") as f:
        (version,) = _read(f, "<I")
        if version < MIN_FORMAT_VERSION:
            raise ConversionError(f"{path}: format version {version} < {MIN_FORMAT_VERSION}")
        spec = _read_string(f)
        if spec != "WhisperSpec":
            raise ConversionError(f"{path}: spec {spec!r} is not WhisperSpec")
        _revision, count = _read(f, "<II")
        variables = dict(_read_variable(f) for _ in range(count))
        (alias_count,) = _read(f, "<I")
        for _ in range(alias_count):
            alias, target = _read_string(f), _read_string(f)
            variables[alias] = variables[target]
    return variables


def _rename(ct2_name: str) -> str:
    """Map a CTranslate2 variable name onto the transformers name (fused q/k/v handled elsewhere)."""
    name = re.sub(r"/layer_(\d+)/", r"/layers/\1/", ct2_name)
    name = name.replace("/", ".")
    replacements = [
        (".self_attention.layer_norm.", ".self_attn_layer_norm."),
        (".attention.layer_norm.", ".encoder_attn_layer_norm."),
        (".ffn.layer_norm.", ".final_layer_norm."),
        (".ffn.linear_0.", ".fc1."),
        (".ffn.linear_1.", ".fc2."),
        (".self_attention.linear_1.", ".self_attn.out_proj."),
        (".attention.linear_2.", ".encoder_attn.out_proj."),
        (".attention.linear_0.", ".encoder_attn.q_proj."),
        ("position_encodings.encodings", "embed_positions.weight"),
        ("embeddings.weight", "embed_tokens.weight"),
        (".gamma", ".weight"),
        (".beta", ".bias"),
    ]
    for old, new in replacements:
        name = name.replace(old, new)
    return "model." + name


def ct2_to_hf_state_dict(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers WhisperForConditionalGeneration state dict from CTranslate2 variables."""
    state: dict[str, np.ndarray] = {}
    for name, array in variables.items():
        if array.dtype.kind != "f" or name == "decoder/projection/weight":
            continue  # flags, head counts and the projection alias of the embeddings
        if "/self_attention/linear_0/" in name:
            fused = name.replace("/self_attention/linear_0/", "/self_attention/FUSED/")
            fused_hf = _rename(fused).replace(".self_attention.FUSED.", ".self_attn.FUSED.")
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), np.split(array, 3, axis=0), strict=True):
                _store_part(state, fused_hf, part, chunk)
        elif "/attention/linear_1/" in name:
            fused = name.replace("/attention/linear_1/", "/attention/FUSED/")
            fused_hf = _rename(fused).replace(".attention.FUSED.", ".encoder_attn.FUSED.")
            for part, chunk in zip(("k_proj", "v_proj"), np.split(array, 2, axis=0), strict=True):
                _store_part(state, fused_hf, part, chunk)
        else:
            state[_rename(name)] = array
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    return state


def _store_part(state: dict[str, np.ndarray], fused_name: str, part: str, chunk: np.ndarray) -> None:
    target = fused_name.replace("FUSED", part)
    if part == "k_proj" and target.endswith(".bias"):
        return  # transformers' key projections carry no bias
    state[target] = chunk


def whisper_config_dict(variables: dict[str, np.ndarray], ct2_config: dict) -> dict:
    """A transformers WhisperConfig dict whose sizes follow from the tensors."""
    vocab, d_model = variables["decoder/embeddings/weight"].shape
    multilingual = vocab >= 51865
    enc_layers = _count_layers(variables, "encoder")
    dec_layers = _count_layers(variables, "decoder")
    ffn = variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    eot, sot = (50257, 50258) if multilingual else (50256, 50257)
    return {
        "model_type": "whisper",
        "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": int(vocab),
        "d_model": int(d_model),
        "encoder_layers": enc_layers,
        "decoder_layers": dec_layers,
        "encoder_attention_heads": int(variables["encoder/num_heads"].item()),
        "decoder_attention_heads": int(variables["decoder/num_heads"].item()),
        "encoder_ffn_dim": int(ffn),
        "decoder_ffn_dim": int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "num_mel_bins": int(variables["encoder/conv1/weight"].shape[1]),
        "max_source_positions": int(variables["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(variables["decoder/position_encodings/encodings"].shape[0]),
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": sot,
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [])),
    }


def _count_layers(variables: dict[str, np.ndarray], side: str) -> int:
    pattern = re.compile(rf"^{side}/layer_(\d+)/")
    return 1 + max(int(m.group(1)) for name in variables if (m := pattern.match(name)))
