"""Whisper's weights in plain torch modules, loaded from a prepared model directory (config.json,
generation_config.json, model.safetensors) without importing transformers, which costs a fresh
process ~2.4 s on a 2-core EPYC (more than loading the weights). The modules carry transformers'
names (`model.encoder.layers[i].self_attn.q_proj`, `proj_out`, ...), so the safetensors keys load
as they are and WhisperBackend, the fixed-shape decoder (forward_whisper.py), the int8 quantizer
and the encoder placement treat either model alike. The encoder's forward follows transformers'
WhisperEncoder operation for operation (tests/test_whisper_model.py compares the two); the
decoder's forward is the fixed-shape engine's own. A drafter on `engine="transformers"` still
loads transformers' model, whose forward it runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from asyncspec.errors import InputError


@dataclass(frozen=True)
class WhisperConfig:
    """The fields of a Whisper config.json this project reads."""

    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_layers: int
    decoder_attention_heads: int
    decoder_ffn_dim: int
    num_mel_bins: int
    vocab_size: int
    max_source_positions: int
    max_target_positions: int
    scale_embedding: bool = False
    activation_function: str = "gelu"
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, raw: dict) -> WhisperConfig:
        if raw.get("model_type") != "whisper":
            raise InputError(f"not a Whisper config (model_type {raw.get('model_type')!r})")
        if raw.get("activation_function", "gelu") != "gelu":
            raise InputError(f"Whisper activation {raw['activation_function']!r} is not supported (gelu only)")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        for key in ("suppress_tokens", "begin_suppress_tokens"):
            values[key] = tuple(int(t) for t in values.get(key) or ())
        try:
            return cls(**values)
        except TypeError as error:
            raise InputError(f"incomplete Whisper config: {error}") from None


@dataclass(frozen=True)
class GenerationConfig:
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()


class EncoderOutput(NamedTuple):
    last_hidden_state: torch.Tensor


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Bidirectional self-attention over x [B, T, D] (the encoder's)."""
        batch, length, _ = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(batch, length, self.heads, self.head_dim).transpose(1, 2).contiguous()

        # queries scaled before the product, as the reference implementation does
        out = F.scaled_dot_product_attention(
            split(self.q_proj(x) * self.scaling), split(self.k_proj(x)), split(self.v_proj(x)), scale=1.0
        )
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, -1))


class EncoderLayer(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class Encoder(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        d = config.d_model
        self.conv1 = nn.Conv1d(config.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(d)
        self.frames = 2 * config.max_source_positions

    def forward(self, features: torch.Tensor) -> EncoderOutput:
        """features [B, mels, 3000] -> [B, 1500, D]"""
        if features.shape[-1] != self.frames:
            raise ValueError(f"Whisper's encoder takes {self.frames} frames, got {features.shape[-1]}")
        x = F.gelu(self.conv2(F.gelu(self.conv1(features)))).permute(0, 2, 1)
        x = x + self.embed_positions.weight
        for layer in self.layers:
            x = layer(x)
        return EncoderOutput(self.layer_norm(x))


class DecoderLayer(nn.Module):
    """Weights only: the fixed-shape engine (forward_whisper.py) runs them."""

    def __init__(self, config: WhisperConfig):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.decoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = Attention(d, config.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.activation_fn = nn.GELU()


class Decoder(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        d = config.d_model
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.embed_positions = nn.Embedding(config.max_target_positions, d)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        self.layer_norm = nn.LayerNorm(d)
        self.embed_scale = d**0.5 if config.scale_embedding else 1.0


class EncoderDecoder(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)


class WhisperModel(nn.Module):
    def __init__(self, config: WhisperConfig, generation_config: GenerationConfig | None = None):
        super().__init__()
        self.config = config
        self.generation_config = generation_config or GenerationConfig()
        self.model = EncoderDecoder(config)
        self.proj_out = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.proj_out.weight = self.model.decoder.embed_tokens.weight  # tied, as Whisper's are


def load_whisper(source: str | Path, dtype: torch.dtype) -> WhisperModel:
    """The model in a prepared directory, its decoder cast to `dtype`; the encoder keeps the file's
    weights in fp32 (`keep_encoder_fp32`), to be placed later."""
    from safetensors.torch import load_file

    directory = Path(source)
    config = WhisperConfig.from_dict(_read_json(directory / "config.json"))
    generation = _read_json(directory / "generation_config.json", missing_ok=True)
    with _initialisation_skipped():
        model = WhisperModel(config, _generation_config(generation))
    state = load_file(directory / "model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [key for key in missing if key != "proj_out.weight"]  # tied to the token embedding
    if missing or unexpected:
        raise InputError(f"{directory}: weights do not match the config: missing {missing}, unexpected {unexpected}")
    return keep_encoder_fp32(model, dtype).eval().requires_grad_(False)


def keep_encoder_fp32(model: Any, dtype: torch.dtype) -> Any:
    """`model` (ours or transformers' Whisper) cast to `dtype` but for its encoder, cast to fp32.
    The encoder's dtype is chosen later by measurement (models/encoder_placement.py); cast to a
    bf16 decoder's dtype and back, its fp32 candidate would run on bf16-rounded weights (the
    prepared files are fp16, which fp32 holds exactly and bf16 does not)."""
    encoder = model.model.encoder
    model.model.encoder = None  # not cast with the rest
    model.to(dtype)
    model.model.encoder = encoder.float()
    return model


@contextmanager
def _initialisation_skipped() -> Iterator[None]:
    """Module constructors fill their weights with random values, and `load_whisper` overwrites
    every one of them at once (a weight it does not load is an error): 0.46 s of whisper-base's
    start. The fills are skipped while the model is built; the memory is then written by the load."""
    fills = ("kaiming_uniform_", "uniform_", "normal_", "ones_", "zeros_")
    saved = {name: getattr(nn.init, name) for name in fills}
    for name in fills:
        setattr(nn.init, name, _left_as_is)
    try:
        yield
    finally:
        for name, fill in saved.items():
            setattr(nn.init, name, fill)


def _left_as_is(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return tensor


def _generation_config(raw: dict) -> GenerationConfig:
    return GenerationConfig(
        suppress_tokens=tuple(int(t) for t in raw.get("suppress_tokens") or ()),
        begin_suppress_tokens=tuple(int(t) for t in raw.get("begin_suppress_tokens") or ()),
    )


def _read_json(path: Path, missing_ok: bool = False) -> dict:
    if missing_ok and not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: {error}") from None
