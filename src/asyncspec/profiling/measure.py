"""`asyncspec profile`'s measurements (seed 000 App. B.2, D.2.1).

Verification calls: after the calibration window's prefill and `offset` reference tokens, a
call of width K feeds K known target-reference tokens and is rolled back; every width is timed
`repetitions` times after `warmup` untimed calls, repetitions outermost so slow drift spreads
over all widths. The sweep runs idle and again while a producer recognises audio on the other
core (the concurrent/idle ratio). Loop costs come from native As²d, target-only and sd runs on
the same calibration window.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from statistics import mean, median

import numpy as np

from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.models.machine import cpu_family_model, cpu_model
from asyncspec.ondevice.buffer import PublishedBatch
from asyncspec.ondevice.sources import SOURCES, ProducerSpec
from asyncspec.profiling.costs import CONCURRENT, IDLE, CostProfile
from asyncspec.spawning import start_worker

LOAD_READY_TIMEOUT_S = 120


def sweep_verify(
    target: Decoder,
    request: DecodeRequest,
    reference: list[int],
    widths: tuple[int, ...],
    offsets: tuple[int, ...],
    repetitions: int,
    warmup: int,
    log: Callable[[str], None],
) -> dict[int, dict[int, list[float]]]:
    """offset -> width -> call seconds. Tokens past the reference's end cycle through it (the
    call's cost does not depend on which tokens it reads, only on how many)."""
    need = max(offsets) + max(widths)
    tokens = [reference[i % len(reference)] for i in range(need)]
    timings: dict[int, dict[int, list[float]]] = {}
    for offset in offsets:
        state = target.prefill(request)
        if offset:
            target.extend(state, tokens[:offset])
        base = state.length
        by_width = timings.setdefault(offset, {k: [] for k in widths})
        for repetition in range(warmup + repetitions):
            for width in widths:
                start = time.perf_counter()
                target.extend(state, tokens[offset : offset + width])
                elapsed = time.perf_counter() - start
                target.rollback(state, base)
                if repetition >= warmup:
                    by_width[width].append(elapsed)
        log(
            f"  offset {offset}: K=1 {1000 * median(by_width[widths[0]]):.1f} ms, K={widths[-1]} "
            f"{1000 * median(by_width[widths[-1]]):.1f} ms"
        )
    return timings


def verify_timings(
    target: Decoder,
    request: DecodeRequest,
    reference: list[int],
    load: ProducerSpec | None,
    widths: tuple[int, ...],
    offsets: tuple[int, ...],
    repetitions: int,
    warmup: int,
    log: Callable[[str], None],
) -> dict[str, dict[int, dict[int, list[float]]]]:
    """The idle sweep and, with a producer spec, the same sweep beside that producer."""
    timings = {IDLE: sweep_verify(target, request, reference, widths, offsets, repetitions, warmup, log)}
    if load is not None:
        log("profile: the same sweep while a producer runs on the other core")
        with ProducerLoad(load, request.audio):
            timings[CONCURRENT] = sweep_verify(target, request, reference, widths, offsets, repetitions, warmup, log)
    return timings


def producer_load_main(spec: ProducerSpec, audio: np.ndarray, ready, stop) -> None:
    """A background producer doing, over the calibration audio, what it does beside a verifying
    target (`steady_load`) until stopped; ready once a first whole run has paid its one-off costs
    (first allocations, kernel choices), as the long-lived native producer has."""
    source = SOURCES[spec.kind](spec)
    source.run(0, audio, lambda batch: None, stop.is_set)
    ready.set()
    source.steady_load(audio, stop.is_set)


class ProducerLoad:
    """Context manager: a producer busy on the other core while the target is timed."""

    def __init__(self, spec: ProducerSpec, audio: np.ndarray):
        context = multiprocessing.get_context("spawn")
        os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))  # as the native producer process has
        self.ready, self.stop = context.Event(), context.Event()
        self.process = context.Process(
            target=producer_load_main, args=(spec, audio, self.ready, self.stop), daemon=True, name="producer-load"
        )

    def __enter__(self) -> ProducerLoad:
        start_worker(self.process)
        if not self.ready.wait(LOAD_READY_TIMEOUT_S):
            self.__exit__()
            raise RuntimeError("the producer load process did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()


def as2d_loop_costs(results: list[DecodeResult]) -> dict[str, float]:
    """Per-round align and out-of-stage costs, and the lead before the first round, of native runs."""
    align, gap, lead, rounds = [], [], [], 0
    for result in results:
        events = [e for e in result.trace.events if e.stage in ("align", "verify")]
        start = result.stats.prefill_s
        aligns = [e.duration for e in events if e.stage == "align"]
        calls = [e.duration for e in events if e.stage == "verify"]
        first = min(e.start for e in events) - start
        lead.append(first)
        align += aligns
        gap.append((result.stats.decode_s - first - sum(aligns) - sum(calls)) / max(len(calls), 1))
        rounds += len(calls)
    return {"align_s": mean(align), "gap_s": mean(gap), "lead_s": mean(lead), "rounds": rounds}


def target_gap(results: list[DecodeResult]) -> float:
    gaps = []
    for result in results:
        calls = [e.duration for e in result.trace.events if e.stage == "verify"]
        gaps.append((result.stats.decode_s - sum(calls)) / max(len(calls), 1))
    return mean(gaps)


def drafter_costs(results: list[DecodeResult]) -> tuple[float, float]:
    """Least-squares fit of one drafting stage = fixed + per-call x drafter calls (sd runs)."""
    rows = [(e.meta.get("drafter_calls", 0), e.duration) for r in results for e in r.trace.events if e.stage == "draft"]
    if len(rows) < 2:
        return 0.0, 0.0
    calls, seconds = np.array(rows, dtype=float).T
    slope, intercept = np.polyfit(calls, seconds, 1) if np.ptp(calls) > 0 else (seconds.mean() / max(calls[0], 1), 0)
    return float(max(intercept, 0.0)), float(max(slope, 0.0))


def producer_costs(results: list[DecodeResult], chunk_s: float) -> dict[str, float]:
    spans = [e.duration for r in results for e in r.trace.events if e.stage == "publish"]
    first = [
        min((e.end for e in r.trace.events if e.stage == "publish"), default=np.nan) - r.stats.prefill_s
        for r in results
    ]
    return {
        "chunk_s": chunk_s,
        "batches": len(spans),
        "batch_work_s_mean": round(mean(spans), 5) if spans else None,
        "first_publication_s_mean": round(float(np.nanmean(first)), 5) if spans else None,
    }


def conversion_costs(sd_runs: list[DecodeResult]) -> dict[str, float]:
    """Vocabulary conversion inside sd's drafting (tiny.en text <-> base tokens), per drafting stage."""
    stages = sum(1 for r in sd_runs for e in r.trace.events if e.stage == "draft")
    total = sum(r.stats.convert_s for r in sd_runs)
    return {"sd_convert_s_per_draft": round(total / stages, 6) if stages else None}


def delivery_latency(samples: int = 200) -> float:
    """Median seconds to hand one published batch through a pipe, as the producer does."""
    sender, receiver = multiprocessing.Pipe()
    batch = PublishedBatch(1, "ct2-chunk", 0, tuple(range(12)), None, 0.0, 0.0)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        sender.send(batch)
        receiver.recv()
        times.append(time.perf_counter() - start)
    sender.close()
    receiver.close()
    return median(times)


def device_facts() -> dict[str, object]:
    import torch

    return {
        "cpu": cpu_model(),
        "cpu_kind": cpu_family_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def build_profile(
    target: Decoder,
    dtype: str,
    timings: dict[str, dict[int, dict[int, list[float]]]],
    as2d_runs: list[DecodeResult],
    target_runs: list[DecodeResult],
    sd_runs: list[DecodeResult],
    chunk_s: float,
) -> CostProfile:
    loop = as2d_loop_costs(as2d_runs)
    drafter_call_s, drafter_step_s = drafter_costs(sd_runs)
    return CostProfile(
        target=target.name,
        dtype=dtype,
        verify=timings,
        align_s=loop["align_s"],
        gap_s=loop["gap_s"],
        target_gap_s=target_gap(target_runs),
        delivery_s=delivery_latency(),
        lead_s=loop["lead_s"],
        drafter_call_s=drafter_call_s,
        drafter_step_s=drafter_step_s,
        producer=producer_costs(as2d_runs, chunk_s) | conversion_costs(sd_runs),
        device=device_facts(),
    )


def native_runs(method: str, target, drafter, request, repetitions: int, budget: int | None = None):
    return [METHODS[method](target, drafter, request, DecodeConfig(budget=budget)) for _ in range(repetitions)]


def modes(concurrent: bool) -> tuple[str, ...]:
    return (IDLE, CONCURRENT) if concurrent else (IDLE,)
