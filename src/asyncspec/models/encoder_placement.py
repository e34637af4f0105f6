"""Where Whisper's encoder runs: its dtype and thread count, chosen by measurement on this machine.

The encoder is most of a window's cost when decoding is fast, and the fastest setting differs
between CPUs: bf16 is ~2x faster than fp32 where the CPU has avx512_bf16 or AMX, and ~3x slower
where it emulates bf16. So each candidate is timed on one 30 s window and the fastest is kept,
cached per machine (CPU model and flags, ISA caps, torch version, model). The encoder's dtype is
part of the target's definition: every method of a process uses the same encoder, so exactness
between methods holds whichever is chosen.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch

ENCODER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
REPEATS = 2  # timed passes per candidate, after one warm-up


@dataclass(frozen=True)
class EncoderPlacement:
    dtype: str  # "fp32" or "bf16"
    threads: int
    measured_ms: dict[str, float]  # "bf16x2" -> median ms of one 30 s window; empty when not measured
    cached: bool = False

    @property
    def torch_dtype(self) -> torch.dtype:
        return ENCODER_DTYPES[self.dtype]

    def summary(self) -> str:
        timings = ", ".join(f"{k} {v:.0f} ms" for k, v in self.measured_ms.items())
        return f"encoder {self.dtype}, {self.threads} thread(s)" + (f" (measured: {timings})" if timings else "")


def thread_candidates() -> list[int]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return sorted({1, cores})


@torch.inference_mode()
def measure(encoder: torch.nn.Module, features: torch.Tensor) -> dict[str, float]:
    """Median ms per candidate (dtype x threads) of one pass over `features` [1, mels, 3000]."""
    timings, before = {}, torch.get_num_threads()
    try:
        for name, dtype in ENCODER_DTYPES.items():
            encoder.to(dtype)
            for threads in thread_candidates():
                torch.set_num_threads(threads)
                encoder(features.to(dtype))  # warm-up: kernels are chosen on the first call
                passes = []
                for _ in range(REPEATS):
                    start = time.perf_counter()
                    encoder(features.to(dtype))
                    passes.append(time.perf_counter() - start)
                timings[f"{name}x{threads}"] = round(1000 * sorted(passes)[len(passes) // 2], 1)
    finally:
        torch.set_num_threads(before)
    return timings


def fastest(timings: dict[str, float]) -> tuple[str, int]:
    name = min(timings, key=timings.get)
    dtype, threads = name.split("x")
    return dtype, int(threads)


def place_encoder(backend, choice: str = "auto", remeasure: bool = False) -> EncoderPlacement:
    """`choice` "fp32"/"bf16" pins the dtype (one thread per core the machine has, measured);
    "auto" measures both dtypes, or reads this machine's cached verdict."""
    if choice not in ("auto", *ENCODER_DTYPES):
        raise ValueError(f"unknown encoder choice {choice!r}; use auto, fp32 or bf16")
    path = _cache_file(backend)
    cached = None if remeasure else _read(path)
    if cached is None:
        features = torch.zeros(1, backend.model.config.num_mel_bins, 3000)
        timings = measure(backend.model.model.encoder, features)
        dtype, threads = fastest(timings)
        cached = EncoderPlacement(dtype, threads, timings)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(cached)))
    if choice != "auto":
        pinned = {k: v for k, v in cached.measured_ms.items() if k.startswith(choice + "x")}
        return EncoderPlacement(choice, fastest(pinned)[1], pinned, cached.cached)
    return cached


def _cache_file(backend):
    import hashlib

    from asyncspec.models.offline import cache_root
    from asyncspec.models.selftest import machine_key

    key = machine_key(backend) | {"what": "encoder placement", "threads": thread_candidates()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / "placement" / f"{digest}.json"


def _read(path) -> EncoderPlacement | None:
    if not path.is_file():
        return None
    try:
        return EncoderPlacement(**{**json.loads(path.read_text()), "cached": True})
    except (ValueError, TypeError):
        return None
