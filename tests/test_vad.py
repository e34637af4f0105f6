"""--vad: the speech Silero VAD finds, joined and transcribed, with every time mapped back to the
original recording (transcription/vad.py)."""

from __future__ import annotations

import numpy as np
import pytest

from asyncspec.transcription.vad import SpeechMap, speech_only

RATE = 16_000


def test_joined_times_map_back_into_their_regions():
    speech = SpeechMap(((RATE, 3 * RATE), (10 * RATE, 11 * RATE), (20 * RATE, 24 * RATE)))  # 2 s, 1 s, 4 s kept
    assert speech.speech_samples == 7 * RATE
    assert speech.to_original(0.0) == 1.0 and speech.to_original(1.5) == 2.5
    assert speech.to_original(2.0) == 10.0  # a segment starting on the seam starts in the second region
    assert speech.to_original(2.0, is_end=True) == 3.0  # one ending there ends in the first
    assert speech.to_original(2.5) == 10.5 and speech.to_original(3.0, is_end=True) == 11.0
    assert speech.to_original(6.9) == pytest.approx(23.9) and speech.to_original(99.0) == 24.0  # clamped
    times = [speech.to_original(t / 10) for t in range(71)]
    assert all(a <= b for a, b in zip(times, times[1:], strict=False))  # never backwards
    assert SpeechMap(()).to_original(3.0) == 3.0
    assert speech.span_to_original(1.8, 2.9) == (10.0, 10.9)  # 0.2 s before the seam: jitter
    assert speech.span_to_original(0.5, 2.3) == (1.5, 3.0)  # 0.3 s past it: the same
    assert speech.span_to_original(0.5, 5.0) == (1.5, 22.0)  # speech on both sides: it spans


def test_silence_is_removed_and_real_speech_kept():
    from asyncspec.audio import load_audio
    from asyncspec.data.librivox import librivox_clips

    clips = [load_audio(clip.path) for clip in librivox_clips()[:2]]
    silence = np.zeros(6 * RATE, np.float32)
    recording = np.concatenate([silence, clips[0], silence, clips[1], silence])
    joined, speech = speech_only(recording)
    spoken = sum(len(c) for c in clips)
    assert len(joined) == speech.speech_samples and 0.9 * spoken < len(joined) < spoken + 4 * RATE
    first, second = 6 * RATE, 12 * RATE + len(clips[0])
    assert speech.regions[0][0] >= first - RATE and speech.regions[-1][1] <= second + len(clips[1]) + RATE
