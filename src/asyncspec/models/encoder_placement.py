"""Where Whisper's encoder runs: its dtype and thread count, chosen by measurement on this machine.

The encoder is most of a window's cost when decoding is fast, and the fastest setting differs
between CPUs: bf16 is ~2x faster than fp32 where the CPU has avx512_bf16 or AMX, and ~3x slower
where it emulates bf16. So each candidate is timed on one 30 s window and the fastest is kept,
cached per machine (CPU model and flags, ISA caps, torch version, model). The encoder's dtype is
part of the target's definition: every method of a process uses the same encoder, so exactness
between methods holds whichever is chosen.

"int8" is the fp32 encoder with its linears on int8 weights and per-row int8 activations
(models/int8_linear.py); its convolutions stay fp32. Where the CPU emulates bf16 it is the
candidate that can beat fp32.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass

import torch

from asyncspec.models.cache_entries import entry_path
from asyncspec.models.int8_linear import Int8Linear, quantize_linears
from asyncspec.models.threads import available_cores, torch_threads

# the dtype each candidate's input and float layers run in
ENCODER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}
AUTO_CANDIDATES = ("fp32", "bf16")
REPEATS = 2  # timed passes per candidate, after one warm-up


@dataclass(frozen=True)
class EncoderPlacement:
    dtype: str  # "fp32", "bf16" or "int8"
    threads: int
    measured_ms: dict[str, float]  # "bf16x2" -> median ms of one 30 s window; empty when not measured
    # the chosen dtype's output is bitwise the same on every thread count tried (reported: a
    # machine where it is not must keep one thread count for the target's definition)
    thread_invariant: bool = False
    cached: bool = False

    @property
    def torch_dtype(self) -> torch.dtype:
        return ENCODER_DTYPES[self.dtype]

    def threads_for(self, wanted: int | None) -> int:
        """`wanted` threads where the output is known to be the same there, else the placement's."""
        if wanted is None or not self.thread_invariant or wanted not in thread_candidates():
            return self.threads
        return wanted

    def summary(self) -> str:
        timings = ", ".join(f"{k} {v:.0f} ms" for k, v in self.measured_ms.items())
        return f"encoder {self.dtype}, {self.threads} thread(s)" + (f" (measured: {timings})" if timings else "")


def thread_candidates() -> list[int]:
    return sorted({1, available_cores()})


def as_candidate(encoder: torch.nn.Module, name: str) -> torch.nn.Module:
    """The encoder in candidate `name`, never changed itself: the encoder where it holds that
    dtype already, else a cast or quantized copy. Cast in place to bf16 and back, the fp32
    encoder the placement then chooses would run on bf16-rounded weights in the process that
    measured, and on the file's weights in every later one: two texts for one target."""
    dtype = ENCODER_DTYPES[name]
    if name != "int8" and all(p.dtype == dtype for p in encoder.parameters()):
        return encoder
    candidate = copy.deepcopy(encoder).to(dtype)
    if name == "int8":
        quantize_linears(candidate)
    return candidate


def place(encoder: torch.nn.Module, name: str) -> None:
    """Put the backend's own encoder in candidate `name`, in place. Quantizing drops the float
    weights and casting to bf16 rounds them, so only an fp32 encoder can be placed again."""
    quantized = any(isinstance(m, Int8Linear) for m in encoder.modules())
    if quantized and name != "int8":
        raise ValueError(f"this encoder's weights are int8 already; it cannot run in {name}")
    held = next(encoder.parameters()).dtype
    if not quantized and held != torch.float32 and held != ENCODER_DTYPES[name]:
        raise ValueError(f"this encoder's weights are {held} already; it cannot run in {name}")
    if name == "int8":
        quantize_linears(encoder.float())
    else:
        encoder.to(ENCODER_DTYPES[name])


@torch.inference_mode()
def measure(encoder: torch.nn.Module, features: torch.Tensor, names=tuple(ENCODER_DTYPES)) -> dict[str, float]:
    """Median ms per candidate (dtype `names` x threads) of one pass over `features` [1, mels, 3000]."""
    timings = {}
    for name in names:
        dtype = ENCODER_DTYPES[name]
        candidate = as_candidate(encoder, name)
        for threads in thread_candidates():
            with torch_threads(threads):
                candidate(features.to(dtype))  # warm-up: kernels are chosen on the first call
                passes = []
                for _ in range(REPEATS):
                    start = time.perf_counter()
                    candidate(features.to(dtype))
                    passes.append(time.perf_counter() - start)
            timings[f"{name}x{threads}"] = round(1000 * sorted(passes)[len(passes) // 2], 1)
    return timings


@torch.inference_mode()
def same_on_every_thread_count(encoder: torch.nn.Module, name: str, mels: int) -> bool:
    """One seeded pseudo-random window through the encoder on each candidate thread count."""
    features = torch.randn(1, mels, 3000, generator=torch.Generator().manual_seed(5)).to(ENCODER_DTYPES[name])
    candidate = as_candidate(encoder, name)
    outputs = []
    for threads in thread_candidates():
        with torch_threads(threads):
            outputs.append(candidate(features).last_hidden_state)
    return all(torch.equal(outputs[0], other) for other in outputs[1:])


def fastest(timings: dict[str, float]) -> tuple[str, int]:
    name = min(timings, key=timings.get)
    dtype, threads = name.split("x")
    return dtype, int(threads)


def place_encoder(backend, choice: str = "auto") -> EncoderPlacement:
    """`choice` "fp32"/"bf16"/"int8" pins the dtype (the thread count is measured); "auto"
    measures the float candidates (or reads this machine's cached verdict) and keeps the fastest."""
    if choice not in ("auto", *ENCODER_DTYPES):
        raise ValueError(f"unknown encoder choice {choice!r}; use auto, {', '.join(ENCODER_DTYPES)}")
    # auto picks among the float encoders only, and measures only them: int8 is used only when
    # asked for, since its quality is not checked here (on the 75 s LibriVox recording of
    # tests/test_longform_real.py it lowered word recall from 0.944 to 0.845), and timing it cost
    # minutes on a CPU without VNNI (17.6 s a pass on a 2-core AVX2-only EPYC)
    wanted = AUTO_CANDIDATES if choice == "auto" else (choice,)
    path = _cache_file(backend)
    measured = _read(path)
    missing = [name for name in wanted if measured is None or name not in measured["thread_invariant"]]
    if missing:
        measured = _measure_into(backend, missing, path)
    timings = measured["measured_ms"]
    eligible = {k: v for k, v in timings.items() if k.split("x")[0] in wanted}
    dtype, threads = fastest(eligible)
    timings = timings if choice == "auto" else eligible  # auto reports every candidate timed
    return EncoderPlacement(dtype, threads, timings, measured["thread_invariant"][dtype], measured["cached"])


def _measure_into(backend, names: list[str], path) -> dict:
    """Measure the candidates `names` and add them to this machine's entry (see _keep_first)."""
    mels, encoder = backend.model.config.num_mel_bins, backend.model.model.encoder
    timings = measure(encoder, torch.zeros(1, mels, 3000), names)
    invariant = {name: same_on_every_thread_count(encoder, name, mels) for name in names}
    return _keep_first({"measured_ms": timings, "thread_invariant": invariant, "cached": False}, path)


def _keep_first(measured: dict, path) -> dict:
    """Every process of this machine must place the encoder alike (its dtype is part of the
    target): the first measurement written of a candidate wins; a process that measured it too
    reads the existing figures, and one that measured other candidates adds them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps({**measured, "cached": True}))
    try:
        os.link(scratch, path)  # atomic: never a half-written file, and an existing one is kept
        return measured
    except FileExistsError:
        existing = _read(path)
        if existing is not None:  # another process measured first: its figures win, ours only add
            merged = {
                "measured_ms": measured["measured_ms"] | existing["measured_ms"],
                "thread_invariant": measured["thread_invariant"] | existing["thread_invariant"],
            }
            added = merged["thread_invariant"] != existing["thread_invariant"]
            if added:
                scratch.write_text(json.dumps({**merged, "cached": True}))
                os.replace(scratch, path)
            return {**merged, "cached": not added}
        os.replace(scratch, path)  # a damaged entry is replaced
        return measured
    finally:
        scratch.unlink(missing_ok=True)


def _cache_file(backend):
    from asyncspec.models.selftest import machine_key

    # not the caller's torch threads: a CLI on one thread and a test on two must place it alike
    key = machine_key(backend) | {"what": "encoder placement", "threads": thread_candidates()}
    return entry_path("placement", key)


def _read(path) -> dict | None:
    """The cached measurement, or None when absent or damaged (then it is measured again)."""
    if not path.is_file():
        return None
    try:
        measured = json.loads(path.read_text())
        if set(measured["thread_invariant"]) <= set(ENCODER_DTYPES) and measured["measured_ms"]:
            return {**measured, "cached": True}
    except (ValueError, TypeError, KeyError):
        pass
    return None
