"""The typed messages between the target side and a producer worker process.

Commands go down one pipe (target side -> worker), reports and batches come up another. Every
message is a frozen dataclass, so each side reads fields by name, never tuple positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Start:
    """A request has arrived: draft from its audio (queued behind earlier requests)."""

    request_id: int
    audio: np.ndarray


@dataclass(frozen=True)
class Stop:
    """The target has finished this request: stop drafting it (or skip it if not yet begun)."""

    request_id: int


@dataclass(frozen=True)
class Close:
    """Shut the worker down."""


@dataclass(frozen=True)
class Ready:
    """The worker has loaded its model."""

    load_s: float


@dataclass(frozen=True)
class Failed:
    """The request's input broke the source; its drafting ended early."""

    request_id: int
    reason: str


@dataclass(frozen=True)
class Done:
    """The worker will publish nothing more for this request. `received` logs the commands the
    worker read while drafting it, and when (the decoupling test reads it)."""

    request_id: int
    finished_at: float
    received: tuple[tuple[str, float], ...]


Command = Start | Stop | Close
