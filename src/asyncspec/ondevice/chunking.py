"""Cutting a window into recogniser chunks at quiet points, so words are not split mid-sound."""

from __future__ import annotations

import numpy as np

from asyncspec.audio import SAMPLE_RATE

FRAME = SAMPLE_RATE // 50  # 20 ms energy frames
SNAP_SECONDS = 0.6  # look this far on each side of a nominal boundary for the quietest frame


def chunk_bounds(samples: np.ndarray, chunk_s: float, snap_s: float = SNAP_SECONDS) -> list[tuple[int, int]]:
    """(start, end) sample ranges covering the audio, each about chunk_s long, cut at the
    quietest 20 ms frame within snap_s of each nominal boundary."""
    if chunk_s <= 0:
        raise ValueError("chunk length must be positive")
    total, nominal, snap = len(samples), int(chunk_s * SAMPLE_RATE), int(snap_s * SAMPLE_RATE)
    bounds, start = [], 0
    while total - start > nominal + snap:
        cut = _quietest(samples, start + nominal - snap, start + nominal + snap)
        bounds.append((start, cut))
        start = cut
    bounds.append((start, total))
    return bounds


def _quietest(samples: np.ndarray, lo: int, hi: int) -> int:
    frames = (hi - lo) // FRAME
    energy = np.square(samples[lo : lo + frames * FRAME].reshape(frames, FRAME)).sum(axis=1)
    return lo + int(np.argmin(energy)) * FRAME + FRAME // 2
