"""When requests arrive: an open loop (Poisson process at a given rate) or a closed loop of N clients.

Both are schedulers a benchmark drives the same way:

    for arrival in scheduler.start(now):          # the requests admitted at the start
        submit(arrival.prompt) at arrival.time
    ... when request i completes at time t:
    for arrival in scheduler.completed(i, t):     # what that completion lets in (closed loop only)
        submit(...)

An open loop knows every arrival up front (`start` yields them all, at their Poisson times); a closed
loop admits N requests at once and one more each time one completes, each `think_s` later.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from asyncspec.errors import InputError


@dataclass(frozen=True)
class Arrival:
    index: int  # position in the request sequence (and in the prompts list, cycled)
    time: float  # seconds, on the caller's clock
    prompt: str


class PoissonArrivals:
    """`n` requests whose inter-arrival gaps are i.i.d. exponential with mean 1/rate (seeded)."""

    def __init__(self, prompts: Sequence[str], rate_per_s: float, n: int | None = None, seed: int = 0):
        _check_prompts(prompts)
        if not (isinstance(rate_per_s, int | float) and 0 < rate_per_s < math.inf):
            raise InputError(f"the arrival rate must be a positive number of requests/s, got {rate_per_s!r}")
        self.prompts, self.rate, self.n = list(prompts), float(rate_per_s), _count(n, prompts)
        self.seed = seed

    def offsets(self) -> np.ndarray:
        """Arrival offsets from the start, seconds [n]; the first request arrives after one gap too."""
        gaps = np.random.default_rng(self.seed).exponential(1.0 / self.rate, size=self.n)
        return np.cumsum(gaps)

    def start(self, now: float = 0.0) -> Iterator[Arrival]:
        for index, offset in enumerate(self.offsets()):
            yield Arrival(index, now + float(offset), self.prompts[index % len(self.prompts)])

    def completed(self, index: int, now: float) -> Iterator[Arrival]:
        return iter(())  # an open loop does not wait for completions


class ClosedLoop:
    """`clients` concurrent clients, each sending its next request `think_s` after its last one completed,
    until `n` requests have been issued."""

    def __init__(self, prompts: Sequence[str], clients: int, n: int | None = None, think_s: float = 0.0):
        _check_prompts(prompts)
        if not (isinstance(clients, int) and clients >= 1):
            raise InputError(f"the number of concurrent clients must be at least 1, got {clients!r}")
        if not (isinstance(think_s, int | float) and 0 <= think_s < math.inf):
            raise InputError(f"the think time must be a finite number of seconds >= 0, got {think_s!r}")
        self.prompts, self.clients, self.n, self.think_s = list(prompts), clients, _count(n, prompts), think_s
        self.issued = 0
        self.outstanding: set[int] = set()

    def _next(self, now: float) -> Arrival:
        index = self.issued
        self.issued += 1
        self.outstanding.add(index)
        return Arrival(index, now, self.prompts[index % len(self.prompts)])

    def start(self, now: float = 0.0) -> Iterator[Arrival]:
        while self.issued < min(self.clients, self.n):
            yield self._next(now)

    def completed(self, index: int, now: float) -> Iterator[Arrival]:
        if index not in self.outstanding:
            raise ValueError(f"request {index} is not outstanding")
        self.outstanding.remove(index)
        if self.issued < self.n:
            yield self._next(now + self.think_s)


def make_scheduler(
    prompts: Sequence[str], rate_per_s: float | None = None, clients: int | None = None, n: int | None = None, seed=0
) -> PoissonArrivals | ClosedLoop:
    """--rate R (open loop, Poisson) or --clients N (closed loop): exactly one of them."""
    if (rate_per_s is None) == (clients is None):
        raise InputError("give either an arrival rate (open loop) or a number of concurrent clients (closed loop)")
    if rate_per_s is not None:
        return PoissonArrivals(prompts, rate_per_s, n, seed)
    return ClosedLoop(prompts, clients, n)


def _check_prompts(prompts: Sequence[str]) -> None:
    if not prompts:
        raise InputError("a workload needs at least one prompt")


def _count(n: int | None, prompts: Sequence[str]) -> int:
    if n is None:
        return len(prompts)
    if not (isinstance(n, int) and n >= 1):
        raise InputError(f"the number of requests must be at least 1, got {n!r}")
    return n
