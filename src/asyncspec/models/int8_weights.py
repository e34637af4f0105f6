"""A prepared model's int8 weights, quantized once and kept in the per-machine cache.

Quantizing every linear of a model at each start cost more than its whole load: 0.87 s of a
1.8 s whisper-base load (48 M weights, six passes over 190 MB of fp32), paid by every cold
`asyncspec transcribe`. The quantized weights are a function of the fp32 weights and the weight
range alone (`int8_linear.quantize_rows`), so they are kept beside the other cache entries,
keyed by the model file's identity (its recorded digest, size and modification time) and the
range, and read back on the next start (safetensors: no code runs on reading them).

A cache file that is missing, damaged or holds other names or shapes is not trusted: the
weights are quantized again and the file replaced. A model built in memory (the tests' tiny
ones) has no file identity and is quantized each time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from asyncspec.models.cache_entries import entry_path
from asyncspec.models.int8_linear import QMAX, REDUCED_WEIGHT_QMAX, quantize_rows

# Bumped when `quantize_rows` or the stored layout changes, so that no older file is read.
QUANTIZED_REVISION = 1
MANIFEST = "asyncspec.json"  # written by `asyncspec models prepare`: the digests of the files
WEIGHTS_FILE = "model.safetensors"
QMAX_OTHER = {QMAX: REDUCED_WEIGHT_QMAX, REDUCED_WEIGHT_QMAX: QMAX}

Quantized = dict[str, tuple[torch.Tensor, torch.Tensor]]  # name -> (int8 [N, K], fp32 scale [N, 1])


def weights_identity(source: str | Path) -> dict | None:
    """What names a prepared model's weights: the file's recorded digest, size and modification
    time (a re-prepared or edited file gets a new identity); None where there is no local file."""
    weights = Path(source) / WEIGHTS_FILE
    if not weights.is_file():
        return None
    stat = weights.stat()
    digest = None
    try:
        digest = json.loads((Path(source) / MANIFEST).read_text())["files"][WEIGHTS_FILE]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # an unprepared folder: its size and time still tell a changed file
    return {"path": str(weights.resolve()), "sha256": digest, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def quantized_weights(weights: dict[str, torch.Tensor], qmax: int, identity: dict | None) -> Quantized:
    """Each weight [N, K] quantized per output channel to [-qmax, qmax]: read from the cache where
    `identity` names a kept copy of exactly these names and shapes, else quantized now (and kept)."""
    if identity is None:
        return {name: quantize_rows(weight.detach(), qmax) for name, weight in weights.items()}
    path = cache_path(identity, qmax)
    kept = _read(path, weights)
    if kept is not None:
        return kept
    quantized = {name: quantize_rows(weight.detach(), qmax) for name, weight in weights.items()}
    _write(path, quantized)
    _remove_superseded(path, identity, qmax)
    return quantized


def _remove_superseded(path: Path, identity: dict, qmax: int) -> None:
    """Entries of an earlier file at the same path (a re-prepared model: 0.5 GB for Qwen 0.5B) go;
    the entry of the other weight range stays (a cache shared by a CPU with VNNI and one without)."""
    other_range = cache_path(identity, QMAX_OTHER[qmax]) if qmax in QMAX_OTHER else None
    for entry in path.parent.glob(f"{_model_stem(identity)}-*.safetensors"):
        if entry != path and entry != other_range:
            entry.unlink(missing_ok=True)


def cache_path(identity: dict, qmax: int) -> Path:
    """The entry's file: named by the model file's path, then by everything in its key."""
    key = {"weights": identity, "qmax": qmax, "revision": QUANTIZED_REVISION}
    entry = entry_path("int8-weights", key)
    return entry.with_name(f"{_model_stem(identity)}-{entry.stem}.safetensors")


def _model_stem(identity: dict) -> str:
    return entry_path("int8-weights", {"path": identity["path"]}).stem[:12]


def _read(path: Path, weights: dict[str, torch.Tensor]) -> Quantized | None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError):
        return None  # damaged: quantized again
    expected = {f"{name}.{part}" for name in weights for part in ("q", "scale")}
    if set(tensors) != expected:
        return None
    kept = {name: (tensors[f"{name}.q"], tensors[f"{name}.scale"]) for name in weights}
    for name, weight in weights.items():
        q, scale = kept[name]
        rows = weight.shape[0]
        if q.shape != weight.shape or q.dtype != torch.int8 or scale.shape != (rows, 1) or scale.dtype != torch.float32:
            return None
    return kept


def _write(path: Path, quantized: Quantized) -> None:
    """Written whole under a name of this process's own, then renamed: a reader sees no part."""
    from safetensors.torch import save_file

    tensors = {}
    for name, (q, scale) in quantized.items():
        tensors[f"{name}.q"], tensors[f"{name}.scale"] = q.contiguous(), scale.contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(scratch))
        os.replace(scratch, path)
    except OSError:
        scratch.unlink(missing_ok=True)  # a read-only or full cache: the weights serve this process only
