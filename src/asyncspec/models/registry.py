"""Resolve a model name (registered offline model, local directory or Hugging Face id) to a backend."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from asyncspec.errors import InputError, ModelNotPreparedError
from asyncspec.models.base import Decoder
from asyncspec.models.offline import REGISTRY, is_prepared, prepare

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
INT8 = "int8"  # int8 weights and per-row int8 activations over an fp32 model (models/int8_linear.py)
AUTO = "auto"  # int8, bf16 or fp32, the fastest on this machine (models/precision_choice.py)
PRECISIONS = (*DTYPES, INT8, AUTO)


def parse_dtype(name: str) -> torch.dtype:
    """The float dtype a model is loaded in (int8 weights are quantized from fp32; "auto" is
    resolved by load_decoder first)."""
    if name == INT8:
        return torch.float32
    if name not in DTYPES:
        raise InputError(f"unknown dtype {name!r}; choose one of {', '.join(PRECISIONS)}")
    return DTYPES[name]


def resolve_source(name: str) -> tuple[str, str]:
    """(where to load from, family) for a registered name, a local directory or a hub id."""
    if name in REGISTRY:
        model = REGISTRY[name]
        if not model.prepare_on_demand and not is_prepared(name):
            raise ModelNotPreparedError(
                f"{name} is not prepared: run `asyncspec models prepare {name}` "
                f"(its weights come from {model.install_hint()}; `make qwen` does both)"
            )
        return str(prepare(name)), model.family
    path = Path(name)
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise InputError(f"{name}: directory has no config.json")
        family = "whisper" if json.loads(config.read_text()).get("model_type") == "whisper" else "causal"
        return str(path), family
    if "/" in name:  # a Hugging Face id, for users who have a hub
        from transformers import AutoConfig

        family = "whisper" if AutoConfig.from_pretrained(name).model_type == "whisper" else "causal"
        return name, family
    raise InputError(
        f"unknown model {name!r}: use one of {', '.join(REGISTRY)}, a local directory or a Hugging Face id"
    )


def load_decoder(
    name: str, dtype: str | torch.dtype = AUTO, engine: str = "fixed-shape", encoder: str = "auto"
) -> Decoder:
    """A target gets the fixed-shape engine (the default); a drafter may take `engine="transformers"`,
    whose one-token steps cost less and whose output need not be exact. A speech model's `encoder`
    is "auto" (dtype and threads measured on this machine), "fp32", "bf16" or "int8". `dtype`
    "int8" gives the decoder int8 weights (the fixed-shape engine stays exact: int8_linear.py);
    "auto", the default, the fastest of int8, bf16 and fp32 on this machine (measured once, cached)."""
    source, family = resolve_source(name)
    choice = None
    if dtype == AUTO:
        dtype, choice = _resolve_auto(source)
    torch_dtype = parse_dtype(dtype) if isinstance(dtype, str) else dtype
    int8 = dtype == INT8
    backend: Decoder
    if family == "whisper":
        from asyncspec.models.hf_whisper import WhisperBackend  # no transformers import on this path

        backend = WhisperBackend.load(source, name=name, dtype=torch_dtype, engine=engine, encoder=encoder, int8=int8)
    else:
        from asyncspec.models.hf_causal import CausalLMBackend

        backend = CausalLMBackend.load(source, name=name, dtype=torch_dtype, engine=engine, int8=int8)
    backend.precision_choice = choice
    return backend


def concrete_dtype(name: str, dtype: str) -> str:
    """`dtype`, or for "auto" the precision load_decoder would choose for `name` on this machine:
    for a benchmark that loads one model in several processes (services, references), which must
    all compute in the same precision whatever their thread counts."""
    return _resolve_auto(resolve_source(name)[0])[0] if dtype == AUTO else dtype


def _resolve_auto(source: str):
    """("auto"'s dtype, the PrecisionChoice behind it); a hub id has nothing local to measure: bf16."""
    from asyncspec.models.precision_choice import choose_precision

    choice = choose_precision(source) if Path(source).is_dir() else None
    return (choice.dtype if choice is not None else "bf16"), choice
