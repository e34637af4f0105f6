"""Long pauses in a recording, found by energy alone (no model), for a warning: after several
seconds of silence Whisper base can repeat its previous text and seek past the speech that
follows. Measured on readers.wav's pieces with 6, 10 and 14 s of silence around each (two noise
seeds each, docs/transcription.md): word recall 58-95 % for asyncspec and 76-94 % for
faster-whisper int8 with the same settings, against 86-95 % for both with VAD. So a user
transcribing such a recording without VAD is told, and VAD stays opt-in as in faster-whisper."""

from __future__ import annotations

import numpy as np

from asyncspec.audio import SAMPLE_RATE

FRAME = SAMPLE_RATE // 50  # 20 ms
LONG_PAUSE_S = 5.0  # shorter pauses (a speaker change, a breath) never misled a window in those runs
QUIET_BELOW_SPEECH_DB = 35.0  # a frame this far below the loud frames' level is silence
SPEECH_LEVEL_PERCENTILE = 95  # the level of the recording's speech, robust to a few clicks


def long_pauses(samples: np.ndarray, min_s: float = LONG_PAUSE_S) -> list[tuple[float, float]]:
    """(start, end) in seconds of every stretch of at least `min_s` quiet 20 ms frames."""
    usable = len(samples) // FRAME * FRAME
    if not usable:
        return []
    frames = samples[:usable].reshape(-1, FRAME).astype(np.float64)
    rms = np.sqrt(np.mean(np.square(frames), axis=1))
    speech_level = np.percentile(rms, SPEECH_LEVEL_PERCENTILE)
    if speech_level <= 0:
        return []
    quiet = rms < speech_level * 10 ** (-QUIET_BELOW_SPEECH_DB / 20)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]])))
    runs = zip(edges[::2], edges[1::2], strict=True)  # [start, end) frame indices of quiet runs
    seconds = FRAME / SAMPLE_RATE
    return [(start * seconds, end * seconds) for start, end in runs if (end - start) * seconds >= min_s]


def pause_note(samples: np.ndarray) -> str | None:
    """What to tell a user who transcribes a recording with long pauses without VAD, or None."""
    pauses = long_pauses(samples)
    if not pauses:
        return None
    start, end = max(pauses, key=lambda pause: pause[1] - pause[0])
    return (
        f"{len(pauses)} pause(s) of {LONG_PAUSE_S:g} s or more (the longest {end - start:.1f} s, at {start:.1f} s): "
        "after a long silence Whisper can repeat earlier text and skip the speech that follows; "
        "vad_filter=True (--vad) removes the pauses before transcribing"
    )
