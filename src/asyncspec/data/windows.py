"""Speech as (dataset, name, 16 kHz samples) windows: LibriVox clips joined into longer windows,
or every file of an audio folder split into decoding windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asyncspec.audio import WINDOW_SECONDS, load_audio, split_windows
from asyncspec.data.librivox import librivox_clips
from asyncspec.errors import InputError


def librivox_windows() -> list[tuple[str, str, np.ndarray]]:
    """(dataset, name, samples): the five clips joined into longer windows of 10-25 s, in several
    orders, so each window is real continuous speech of a length where drafting start-up matters less."""
    clips = [load_audio(clip.path) for clip in librivox_clips()]
    groups: dict[str, list[tuple[int, ...]]] = {
        "librivox-25s": [(0, 1, 2, 3, 4), (2, 3, 4, 0, 1), (4, 0, 1, 2, 3)],
        "librivox-15s": [(0, 1, 2), (2, 3, 4), (1, 3, 4), (0, 3, 4)],
        "librivox-10s": [(0, 1), (3, 4, 1), (2, 3)],
    }
    return [
        (dataset, "+".join(str(i) for i in order), np.concatenate([clips[i] for i in order]))
        for dataset, orders in groups.items()
        for order in orders
    ]


def directory_windows(directory: str) -> list[tuple[str, str, np.ndarray]]:
    root = Path(directory)
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in {".wav", ".flac", ".ogg", ".mp3"})
    if not files:
        raise InputError(f"{directory}: no audio files (wav, flac, ogg, mp3)")
    return [
        (root.name, f"{path.name}#{w.index}", w.samples)
        for path in files
        for w in split_windows(load_audio(path), WINDOW_SECONDS)
    ]
