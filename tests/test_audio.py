"""Audio input: formats, rates, channels, windows, and a clear error for every bad input."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

from asyncspec.audio import SAMPLE_RATE, load_audio, split_windows
from asyncspec.errors import InputError


def _tone(rate: int, seconds: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    mono = 0.4 * np.sin(2 * np.pi * 440 * t)
    return np.stack([mono] * channels, axis=1) if channels > 1 else mono


@pytest.mark.parametrize(
    "suffix, rate, channels", [(".wav", 8000, 1), (".flac", 44100, 2), (".ogg", 22050, 1), (".mp3", 48000, 2)]
)
def test_formats_rates_and_channels_become_16k_mono(tmp_path, suffix, rate, channels):
    path = tmp_path / f"tone{suffix}"
    soundfile.write(path, _tone(rate, 1.5, channels), rate)
    samples = load_audio(path)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - 1.5 * SAMPLE_RATE) < 0.05 * SAMPLE_RATE  # mp3 adds codec padding
    assert 0.3 < np.abs(samples).max() < 0.5


def test_windows_cover_the_audio_in_at_most_30_seconds():
    samples = np.zeros(int(71.5 * SAMPLE_RATE), np.float32)
    windows = split_windows(samples)
    assert [w.duration_s for w in windows] == [30.0, 30.0, 11.5]
    assert [w.start_s for w in windows] == [0.0, 30.0, 60.0]
    assert sum(len(w.samples) for w in windows) == len(samples)


def _write_bytes(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.wav", "no such file"),
        (lambda d: _write_bytes(d / "notes.wav", b"these are words, not audio\n" * 20), "not a readable audio file"),
        (lambda d: _write_bytes(d / "zero.wav", b""), "not a readable audio file"),
        (lambda d: (soundfile.write(d / "empty.wav", np.zeros(0), 16000), d / "empty.wav")[1], "empty"),
        (lambda d: (soundfile.write(d / "silent.wav", np.zeros(16000), 16000), d / "silent.wav")[1], "silent"),
        (lambda d: (soundfile.write(d / "tiny.wav", np.full(10, 0.3), 16000), d / "tiny.wav")[1], "too short"),
    ],
)
def test_bad_input_gets_a_clear_error(tmp_path, make, message):
    with pytest.raises(InputError, match=message):
        load_audio(make(tmp_path))


def test_absurd_length_is_refused_before_decoding(tmp_path):
    soundfile.write(tmp_path / "long.wav", _tone(16000, 3.0), 16000)
    with pytest.raises(InputError, match="exceeds the limit"):
        load_audio(tmp_path / "long.wav", max_seconds=2.0)
