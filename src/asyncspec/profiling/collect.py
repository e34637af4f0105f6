"""Native runs that feed replay: per window, target-only (the reference) and As²d once per
catalog producer (its publication stream), with their stage events."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import numpy as np

from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.exactness import ExactnessCheck
from asyncspec.models.base import Decoder
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.profiling.deployed import ProducerChoice
from asyncspec.profiling.trajectory import WindowTrajectory, reference_trajectory
from asyncspec.run.report import progress
from asyncspec.transcription.loading import make_producer

Window = tuple[str, str, np.ndarray]  # (dataset, name, 16 kHz samples)


@dataclass
class Collection:
    trajectories: list[WindowTrajectory] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)  # "window producer": output != target-only
    native: dict[str, list[DecodeResult]] = field(default_factory=dict)  # run key -> results
    exactness: ExactnessCheck = field(default_factory=ExactnessCheck)  # every As²d run against target-only


@contextmanager
def producers(choices: list[ProducerChoice], producer_model: str, dtype: str, target: Decoder) -> Iterator[dict]:
    """One persistent worker per catalog producer, all closed on exit."""
    with ExitStack() as stack:
        opened = {}
        for choice in choices:
            process = make_producer(choice.kind, choice.chunk_s, producer_model, dtype, target)
            stack.callback(process.close)
            opened[choice.name] = process
        yield opened


def collect(target: WhisperBackend, workers: dict, windows: list[Window], budget: int, label: str) -> Collection:
    """Target-only then As²d with each producer, per window (interleaved: they share machine drift)."""
    collection = Collection(exactness=ExactnessCheck(target))
    for dataset, name, samples in progress(windows, len(windows), label):
        request = target.request(samples)
        reference = METHODS["target"](target, None, request, DecodeConfig())
        trajectory = reference_trajectory(name, dataset, samples, target, reference, request)
        collection.native.setdefault("target", []).append(reference)
        for producer, worker in workers.items():
            result = METHODS["as2d"](target, worker, request, DecodeConfig(budget=budget))
            equal = collection.exactness.check(
                f"{dataset} {name}", f"as2d ({producer})", request, reference.tokens, result.tokens
            )
            add_producer_run(collection, trajectory, producer, result, budget, equal)
        collection.trajectories.append(trajectory)
    return collection


def add_producer_run(
    collection: Collection,
    trajectory: WindowTrajectory,
    producer: str,
    result: DecodeResult,
    budget: int,
    equal: bool,
) -> None:
    """Keep an As²d run's publications for replay, unless its output differs from target-only
    (`equal`, as the caller's exactness check found; the mismatch itself fails the command)."""
    collection.native.setdefault(f"as2d:{producer}", []).append(result)
    if not equal:
        collection.mismatches.append(f"{trajectory.window} {producer}")
        return
    trajectory.add_native(f"as2d:{producer}", result, budget)


def merged(collections: list[Collection]) -> Collection:
    """Several collections of the same windows as one: the first's trajectories, every run's
    native results, mismatches and exactness verdicts."""
    first, *rest = collections
    whole = Collection(first.trajectories, list(first.mismatches), dict(first.native), first.exactness)
    for other in rest:
        whole.mismatches += other.mismatches
        whole.exactness.absorb(other.exactness)
        for key, results in other.native.items():
            whole.native[key] = [*whole.native.get(key, []), *results]
    return whole
