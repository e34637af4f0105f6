"""The prepared transformers Whisper weights as a whisper.cpp model file (its legacy `ggml` format),
built once into `<cache>/ggml/<name>.bin` for the whisper.cpp baseline of `asyncspec bench e2e`.

The file, as whisper.cpp's loader (`whisper_model_load`) reads it, all little-endian:
  magic 0x67676d6c; eleven int32 hparams (n_vocab, n_audio_ctx, n_audio_state, n_audio_head,
  n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype);
  the mel filterbank: int32 n_mel, int32 n_freq, then n_mel x n_freq float32, one filter per row;
  the vocabulary: int32 count, then per token in id order an int32 length and its raw bytes;
  the tensors to the end of the file: int32 n_dims, int32 name length, int32 type (0 f32, 1 f16),
  n_dims int32 sizes innermost first (ggml's order: a numpy shape reversed), the name, the data.

The loader has fixed types per tensor and reads the bytes as they are, so the types follow it:
with ftype 1, matrices and conv kernels in float16 (the weights ship in float16, nothing is lost),
norms, biases and both positional embeddings in float32. A marker beside the file records what it
was built from (the prepared model's file digests, this converter's version) and the file's own
SHA-256; a file whose marker does not match is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from asyncspec.errors import InputError
from asyncspec.models.cache_entries import write_entry
from asyncspec.models.log_mel import mel_filters
from asyncspec.models.offline import MANIFEST, REGISTRY, cache_root, prepare

GGML_MAGIC = 0x67676D6C
# Bump when the bytes written change: every cached file built by an older converter is then rebuilt.
CONVERTER_VERSION = 1
F32, F16 = 0, 1
# The prepared files the conversion reads; their digests (from the prepared manifest) name its input.
INPUT_FILES = ("config.json", "model.safetensors", "tokenizer.json")

# transformers' names inside a layer -> whisper.cpp's (the decoder's encoder_attn is its cross_attn).
_LAYER_NAMES = {
    "self_attn.q_proj": "attn.query",
    "self_attn.k_proj": "attn.key",
    "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out",
    "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query",
    "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value",
    "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln",
    "fc1": "mlp.0",
    "fc2": "mlp.2",
    "final_layer_norm": "mlp_ln",
}
_TOP_NAMES = {
    "encoder.embed_positions.weight": "encoder.positional_embedding",
    "encoder.layer_norm.weight": "encoder.ln_post.weight",
    "encoder.layer_norm.bias": "encoder.ln_post.bias",
    "decoder.embed_positions.weight": "decoder.positional_embedding",
    "decoder.embed_tokens.weight": "decoder.token_embedding.weight",
    "decoder.layer_norm.weight": "decoder.ln.weight",
    "decoder.layer_norm.bias": "decoder.ln.bias",
}
# whisper.cpp allocates these as float32 whatever the ftype; it would refuse float16 bytes for them.
_ALWAYS_F32 = {
    "encoder.conv1.bias",
    "encoder.conv2.bias",
    "encoder.positional_embedding",
    "decoder.positional_embedding",
}

# A hook for tests and diagnostics: (whisper.cpp name, array) -> the array to write instead.
Transform = Callable[[str, np.ndarray], np.ndarray]


def ggml_name(hf_name: str) -> str:
    """whisper.cpp's tensor name for a transformers WhisperForConditionalGeneration parameter."""
    name = hf_name.removeprefix("model.")
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".")
    if parts[0] == "encoder" and parts[1] in ("conv1", "conv2"):
        return name
    if parts[0] in ("encoder", "decoder") and parts[1] == "layers" and len(parts) >= 5:
        inner = ".".join(parts[3:-1])
        if inner in _LAYER_NAMES:
            return f"{parts[0]}.blocks.{parts[2]}.{_LAYER_NAMES[inner]}.{parts[-1]}"
    raise InputError(f"{hf_name}: no whisper.cpp tensor corresponds to it")


def vocabulary_bytes(tokenizer_json: Path) -> list[bytes]:
    """The BPE tokens below <|endoftext|>, in id order, as the bytes they stand for. whisper.cpp
    adds the special tokens (eot, sot, languages, timestamps) itself from n_vocab, as its own
    converter leaves them out; byte-level BPE writes each byte as one printable character."""
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    eot = next((t["id"] for t in spec.get("added_tokens", []) if t["content"] == "<|endoftext|>"), None)
    if spec["model"].get("type") != "BPE" or eot is None:
        raise InputError(f"{tokenizer_json}: not a Whisper byte-level BPE tokenizer")
    by_id = {index: token for token, index in spec["model"]["vocab"].items() if index < eot}
    if sorted(by_id) != list(range(eot)):
        raise InputError(f"{tokenizer_json}: token ids below {eot} are not contiguous")
    decode = {char: byte for byte, char in _byte_characters().items()}
    try:
        return [bytes(decode[char] for char in by_id[index]) for index in range(eot)]
    except KeyError as missing:
        raise InputError(f"{tokenizer_json}: {missing} is not a byte-level BPE character") from None


def _byte_characters() -> dict[int, str]:
    """GPT-2's byte -> character table: printable bytes as themselves, the rest from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    extra = (byte for byte in range(256) if byte not in table)
    table.update({byte: chr(256 + n) for n, byte in enumerate(extra)})
    return table


def hparams(config: dict) -> list[int]:
    if config.get("d_model") is None or config.get("model_type") != "whisper":
        raise InputError("not a transformers Whisper config")
    # The order of whisper.cpp's hparams; audio and text states are both d_model.
    keys = ["vocab_size", "max_source_positions", "d_model", "encoder_attention_heads", "encoder_layers"]
    keys += ["max_target_positions", "d_model", "decoder_attention_heads", "decoder_layers", "num_mel_bins"]
    return [int(config[key]) for key in keys] + [F16]


def ggml_tensors(model_directory: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(whisper.cpp name, array in the type and shape the file holds) for every weight, one at a
    time. proj_out is tied to the token embedding and is not stored (whisper.cpp ties it too)."""
    from safetensors import safe_open

    with safe_open(str(model_directory / "model.safetensors"), framework="numpy") as weights:
        for hf_name in weights.keys():
            if hf_name == "proj_out.weight":
                continue
            name = ggml_name(hf_name)
            array = weights.get_tensor(hf_name)
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                array = array.reshape(-1, 1)  # ggml adds them as (1, n_state) to the conv output
            f32 = array.ndim < 2 or name in _ALWAYS_F32
            yield name, np.ascontiguousarray(array, dtype=np.float32 if f32 else np.float16)


def write_ggml(model_directory: Path, out: Path, transform: Transform | None = None) -> None:
    """The whisper.cpp file of a transformers Whisper directory (config, safetensors, tokenizer)."""
    config = json.loads((model_directory / "config.json").read_text())
    params = hparams(config)
    filters = mel_filters(config["num_mel_bins"])
    vocab = vocabulary_bytes(model_directory / "tokenizer.json")
    with open(out, "wb") as f:
        f.write(struct.pack("<I", GGML_MAGIC) + struct.pack("<11i", *params))
        filters = transform("mel_filters", filters) if transform else filters
        f.write(struct.pack("<2i", *filters.shape) + filters.astype("<f4").tobytes())
        f.write(struct.pack("<i", len(vocab)))
        for token in vocab:
            f.write(struct.pack("<i", len(token)) + token)
        for name, array in ggml_tensors(model_directory):
            array = transform(name, array) if transform else array
            encoded = name.encode()
            kind = F32 if array.dtype == np.float32 else F16
            f.write(struct.pack("<3i", array.ndim, len(encoded), kind))
            f.write(struct.pack(f"<{array.ndim}i", *array.shape[::-1]))  # ggml's order: innermost first
            f.write(encoded + array.astype(array.dtype.newbyteorder("<")).tobytes())


def read_tensor_index(path: Path) -> dict[str, tuple[int, tuple[int, ...], int]]:
    """name -> (data offset, numpy shape, type) of every tensor in a whisper.cpp file: what the
    tests inspect and tamper with. Reading it walks the whole header, so a truncated file fails."""
    data = path.read_bytes()
    if struct.unpack_from("<I", data)[0] != GGML_MAGIC:
        raise InputError(f"{path}: not a ggml Whisper file")
    offset = 4 + 11 * 4
    n_mel, n_freq = struct.unpack_from("<2i", data, offset)
    offset += 8 + 4 * n_mel * n_freq
    (count,) = struct.unpack_from("<i", data, offset)
    offset += 4
    for _ in range(count):
        offset += 4 + struct.unpack_from("<i", data, offset)[0]
    index = {}
    while offset < len(data):
        n_dims, length, kind = struct.unpack_from("<3i", data, offset)
        shape = struct.unpack_from(f"<{n_dims}i", data, offset + 12)[::-1]
        offset += 12 + 4 * n_dims
        name = data[offset : offset + length].decode()
        offset += length
        index[name] = (offset, tuple(shape), kind)
        offset += int(np.prod(shape)) * (4 if kind == F32 else 2)
    if offset != len(data):
        raise InputError(f"{path}: truncated")
    return index


def ggml_file(name: str) -> Path:
    """`<cache>/ggml/<name>.bin` for a registered Whisper model, (re)built when it is missing or its
    marker does not match the prepared weights, this converter or the file's own digest."""
    if name not in REGISTRY or REGISTRY[name].family != "whisper":
        raise InputError(f"{name}: not a registered Whisper model")
    source = prepare(name, log=lambda _: None)
    path = cache_root() / "ggml" / f"{name}.bin"
    marker = path.with_suffix(".json")
    expected = _marker_inputs(name, source)
    if _is_current(path, marker, expected):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    work = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_ggml(source, work)
        digest = _sha256(work)
        marker.unlink(missing_ok=True)  # a crash between the two renames leaves no stale marker behind
        os.replace(work, path)
        write_entry(marker, expected | {"sha256": digest, "bytes": path.stat().st_size})
    finally:
        work.unlink(missing_ok=True)
    return path


def _marker_inputs(name: str, source: Path) -> dict:
    digests = json.loads((source / MANIFEST).read_text())["files"]
    return {"name": name, "converter_version": CONVERTER_VERSION, "inputs": {f: digests[f] for f in INPUT_FILES}}


def _is_current(path: Path, marker: Path, expected: dict) -> bool:
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if any(recorded.get(key) != value for key, value in expected.items()) or not path.is_file():
        return False
    # The size first: a truncated or replaced file is caught without reading it.
    return recorded.get("bytes") == path.stat().st_size and recorded.get("sha256") == _sha256(path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
