"""Where Whisper's encoder runs: its dtype and thread count, chosen by measurement on this machine.

The encoder is most of a window's cost when decoding is fast, and the fastest setting differs
between CPUs: bf16 is ~2x faster than fp32 where the CPU has avx512_bf16 or AMX, and ~3x slower
where it emulates bf16. So each candidate is timed on one 30 s window and the fastest is kept,
cached per machine (CPU model and flags, ISA caps, torch version, model). The encoder's dtype is
part of the target's definition: every method of a process uses the same encoder, so exactness
between methods holds whichever is chosen.

"int8" is the fp32 encoder with its linears on int8 weights and per-row int8 activations
(models/int8_linear.py); its convolutions and attention stay fp32. Where the CPU emulates bf16 it
is the candidate that can beat fp32, so auto times it wherever an int8 product of the encoder's
kind is faster than fp32's (`pays_here`): on a CPU without VNNI it is slower, and timing a
whole pass there cost minutes. bf16 is probed alike: where the CPU emulates it, timing its passes
and checking them on every thread count was most of a first run's placement (Zen 2 EPYC: 68 s,
a bf16 pass 5.4 s on two threads against fp32's 0.7). The int8 encoder's output lies as far from
fp32's as CTranslate2's int8 encoder's (faster-whisper's) lies from its float32 (relative error
0.053 against 0.054 on the long-form set's windows; scripts/int8_encoder_error.py); WER in
docs/int8.md. Where the CPU's int8 kernels saturate at 8-bit weights (no VNNI), the weights use 7
bits (int8_linear.weight_range), and auto never takes the int8 encoder there
(`int8_accurate_here`): on a Zen 2 EPYC it put WER 0.36 points above fp32 on the large long-form
set, over the bound int8 is held to, where the int8 decoder with the fp32 encoder stayed 0.20 below.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from asyncspec.models.cache_entries import entry_path
from asyncspec.models.int8_linear import QMAX, Int8Linear, quantize_linears, weight_range
from asyncspec.models.precision_choice import median_seconds
from asyncspec.models.threads import available_cores, openmp_settings, torch_threads

# the dtype each candidate's input and float layers run in
ENCODER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}
PROBED = ("bf16", "int8")  # auto times these beside fp32 only where `pays_here`
REPEATS = 2  # timed rounds over the candidates, after one warm-up round
FRAMES = 1500  # a 30 s window's encoder frames: the rows of each encoder linear
# auto takes the int8 encoder only where it needs at most this share of the fastest float
# encoder's time: its text may differ from theirs at a near-tie, and two placements of one Zen 4
# EPYC measured int8 at 386 and 457 ms and bf16 at 434 and 358 ms, so a smaller lead is noise
INT8_SHARE = 0.8
# bumped when a candidate's cost changes: 2, int8 linears in place (an int8 pass 438 -> 337 ms on
# a 2-core Zen 4 capped to VNNI), which may now beat a float encoder it lost to; 3, the OpenMP
# settings in the key: an entry timed by the test suite (OMP_WAIT_POLICY=PASSIVE, two workers) had
# every encoder slower on two threads than on one, and a quiet bench then ran bf16 on one thread,
# 687 ms a window where two threads take ~430; 4, FBGEMM's int8 linears, fast on an AVX2-only CPU
# where torch._int_mm is not (an entry there had declined int8); 5, the fastest of interleaved
# passes where it was the slower of two consecutive ones (`measure`)
REVISION = 5


@dataclass(frozen=True)
class EncoderPlacement:
    dtype: str  # "fp32", "bf16" or "int8"
    threads: int
    measured_ms: dict[str, float]  # "bf16x2" -> ms of its fastest pass over a 30 s window; empty if not measured
    # the chosen dtype's output is bitwise the same on every thread count tried (reported: a
    # machine where it is not must keep one thread count for the target's definition)
    thread_invariant: bool = False
    cached: bool = False
    int8_declined: str = ""  # why auto did not take the int8 encoder (_why_int8_declined)

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
        measured = f" (measured: {timings})" if timings else ""
        declined = f"; int8 not taken: {self.int8_declined}" if self.int8_declined else ""
        return f"encoder {self.dtype}, {self.threads} thread(s){measured}{declined}"


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
    """ms of each candidate's (dtype `names` x threads) fastest pass over `features` [1, mels, 3000].
    Every candidate is warmed up, then REPEATS rounds time each candidate once in turn: load that
    comes and goes (As²d's producer loads its model while the target's encoder is placed) then slows
    a pass of every candidate rather than all passes of one, and the fastest pass is the least
    disturbed. One candidate after another, slower of two passes, a Zen 2 EPYC cached fp32 at
    1,087 ms and int8 at 806 for an encoder that takes 707 and 656 ms when quiet."""
    runs = {}
    for name in names:
        candidate, inputs = as_candidate(encoder, name), features.to(ENCODER_DTYPES[name])
        runs.update({f"{name}x{threads}": (candidate, inputs, threads) for threads in thread_candidates()})
    fastest_pass = dict.fromkeys(runs, float("inf"))
    for lap in range(REPEATS + 1):  # lap 0 warms up: kernels are chosen on the first call
        for key, (candidate, inputs, threads) in runs.items():
            with torch_threads(threads):
                start = time.perf_counter()
                candidate(inputs)
                seconds = time.perf_counter() - start
            if lap:
                fastest_pass[key] = min(fastest_pass[key], seconds)
    return {key: round(1000 * seconds, 1) for key, seconds in fastest_pass.items()}


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
    """The fastest (dtype, threads); int8 only where it takes at most INT8_SHARE of the fastest
    float candidate's time (or no float candidate was timed: int8 asked for)."""
    floats = {name: ms for name, ms in timings.items() if not name.startswith("int8x")}
    name = min(timings, key=timings.get)
    if name.startswith("int8x") and floats and timings[name] > INT8_SHARE * min(floats.values()):
        name = min(floats, key=floats.get)
    dtype, threads = name.split("x")
    return dtype, int(threads)


def place_encoder(backend, choice: str = "auto") -> EncoderPlacement:
    """`choice` "fp32"/"bf16"/"int8" pins the dtype (the thread count is measured); "auto"
    measures the candidates (or reads this machine's cached verdict) and keeps the fastest."""
    if choice not in ("auto", *ENCODER_DTYPES):
        raise ValueError(f"unknown encoder choice {choice!r}; use auto, {', '.join(ENCODER_DTYPES)}")
    path = _cache_file(backend)
    measured = _read(path)
    wanted: tuple[str, ...] = (choice,)
    declined: tuple[str, ...] = ()
    if choice == "auto":
        offered = [name for name in PROBED if _timed_or_pays(name, backend.model.model.encoder, measured)]
        wanted, declined = ("fp32", *offered), tuple(name for name in PROBED if name not in offered)
    missing = [name for name in wanted if measured is None or name not in measured["thread_invariant"]]
    unrecorded = measured is None or not set(declined) <= set(measured["declined"])
    if missing or unrecorded:
        measured = _measure_into(backend, missing, declined, path)
    timings = measured["measured_ms"]
    eligible = {k: v for k, v in timings.items() if k.split("x")[0] in wanted}
    dtype, threads = fastest(eligible)
    timings = timings if choice == "auto" else eligible  # auto reports every candidate timed
    invariant, cached = measured["thread_invariant"][dtype], measured["cached"]
    return EncoderPlacement(dtype, threads, timings, invariant, cached, _why_int8_declined(choice, timings, dtype))


def int8_accurate_here() -> bool:
    """Does the int8 encoder keep 8-bit weights on this CPU (module docstring)? With 7-bit ones its
    WER left the bound int8 is held to, so auto does not offer it; asked for, it runs."""
    return weight_range() == QMAX


def _why_int8_declined(choice: str, timings: dict[str, float], dtype: str) -> str:
    """Why auto did not take the int8 encoder, where that is worth reporting: its weights would be
    7-bit here, or it was timed fastest but within the noise of a float encoder."""
    if choice != "auto" or dtype == "int8":
        return ""
    if not int8_accurate_here():
        return f"its weights would use {weight_range().bit_length() + 1} bits on this CPU, and WER rose (docs/int8.md)"
    if timings and min(timings, key=timings.get).startswith("int8x"):
        return f"not under {INT8_SHARE:.0%} of the fastest float encoder's time"
    return ""


def _timed_or_pays(name: str, encoder: torch.nn.Module, measured: dict | None) -> bool:
    """Is `name` ("bf16" or "int8") one of auto's candidates: timed on this machine already, or not
    yet decided and its products faster than fp32's here (int8 never with 7-bit weights)? A
    decision not to time it is kept in the entry."""
    if name == "int8" and not int8_accurate_here():
        return False
    if measured is not None and name in measured["thread_invariant"]:
        return True
    if measured is not None and name in measured["declined"]:
        return False
    return pays_here(encoder, name)


@torch.inference_mode()
def pays_here(encoder: torch.nn.Module, name: str) -> bool:
    """Is the encoder's widest linear, over a window's frames, faster in `name` ("bf16" or "int8")
    than in fp32 on this CPU? Where only torch._int_mm's slow path was there int8 was not (a 2-core
    AVX2-only EPYC: a whole int8 pass took 17.6 s against fp32's 1.7 s, before FBGEMM was a
    layout), nor is bf16 where the CPU emulates it; only where it is can that encoder win, so only
    there is it timed."""
    linear = max((m for m in encoder.modules() if isinstance(m, torch.nn.Linear)), key=lambda m: m.weight.numel())
    weight = linear.weight.detach().float()
    frames = torch.randn(FRAMES, linear.in_features, generator=torch.Generator().manual_seed(0))
    candidate: Callable[[torch.Tensor], torch.Tensor]
    if name == "int8":
        candidate, inputs = Int8Linear(weight, None), frames
    else:
        weight_bf16 = weight.bfloat16()
        candidate, inputs = (lambda x: torch.nn.functional.linear(x, weight_bf16)), frames.bfloat16()
    fp32 = lambda x: torch.nn.functional.linear(x, weight)  # noqa: E731
    candidate(inputs), fp32(frames)  # warm-up: kernels are chosen on the first call
    return median_seconds(candidate, inputs) < median_seconds(fp32, frames)


def _measure_into(backend, names: list[str], declined: tuple[str, ...], path) -> dict:
    """Measure the candidates `names` and add them, and the `declined` ones, to this machine's
    entry (see _keep_first)."""
    mels, encoder = backend.model.config.num_mel_bins, backend.model.model.encoder
    timings = measure(encoder, torch.zeros(1, mels, 3000), names)
    invariant = {name: same_on_every_thread_count(encoder, name, mels) for name in names}
    entry = {"measured_ms": timings, "thread_invariant": invariant, "declined": sorted(declined), "cached": False}
    return _keep_first(entry, path)


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
                "declined": sorted(set(measured["declined"]) | set(existing["declined"])),
            }
            added = any(merged[key] != existing[key] for key in ("thread_invariant", "declined"))
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
    asked = {"what": "encoder placement", "threads": thread_candidates(), "openmp": openmp_settings()}
    key = machine_key(backend) | asked | {"revision": REVISION}
    return entry_path("placement", key)


def _read(path) -> dict | None:
    """The cached measurement, or None when absent or damaged (then it is measured again)."""
    if not path.is_file():
        return None
    try:
        measured = json.loads(path.read_text())
        measured.setdefault("declined", [])  # entries written before auto could time int8
        if set(measured["thread_invariant"]) <= set(ENCODER_DTYPES) and measured["measured_ms"]:
            return {**measured, "cached": True}
    except (ValueError, TypeError, KeyError):
        pass
    return None
