"""torch's intra-op thread count: the cores this process may use, and a scoped change of it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch at `threads` threads inside the block, its previous count after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# Not a setting a measurement depends on: it only sets the default thread count, and the keys carry
# the counts they measured. The As²d producer sets it in this process's environment for the worker
# it spawns, so with it an As²d process and a target-only one keyed their encoder placement apart,
# measured it apart, and placed the encoder in int8 and fp32 (2-core Zen 2, 2026-12-06): a cold
# `transcribe --method target` then gave other text than the bench's warm target.
THREAD_COUNT_VARIABLES = ("OMP_NUM_THREADS",)


def openmp_settings() -> dict[str, str]:
    """The OpenMP variables in effect that a call's timing depends on (OMP_WAIT_POLICY above all)."""
    return {
        name: value
        for name, value in sorted(os.environ.items())
        if name.startswith(("OMP_", "KMP_")) and name not in THREAD_COUNT_VARIABLES
    }
