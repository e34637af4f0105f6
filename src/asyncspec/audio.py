"""Audio input: any file libsndfile reads (WAV, FLAC, OGG, MP3), any rate -> 16 kHz mono float32,
validated, and split into windows of at most 30 s (each window is decoded as one request)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
import soxr

from asyncspec.errors import InputError

SAMPLE_RATE = 16_000
WINDOW_SECONDS = 30.0
MAX_SECONDS = 4 * 3600.0  # longer inputs are almost surely a mistake (or a stream, not a file)
SILENCE_PEAK = 1e-4  # full scale is 1.0; below this nothing is audible
MIN_SECONDS = 0.1  # shorter holds no word; a 10-sample file once crashed As²d's producer
MAX_RATE = 192_000  # beyond any real recording; a 384 kHz x 8-channel header is a decompression bomb
MAX_CHANNELS = 8
# What a file may decode to (frames x channels), whatever its header says: 10 minutes of 48 kHz stereo
# (230 MB of float32). The duration limit alone let a tiny FLAC at 384 kHz x 8 channels decode to GBs.
MAX_UPLOAD_DECODED_SAMPLES = 600 * 48_000 * 2


@dataclass(frozen=True)
class AudioWindow:
    index: int
    start_s: float
    samples: np.ndarray  # float32 [n] at SAMPLE_RATE

    @property
    def duration_s(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def load_audio(path: str | Path, max_seconds: float = MAX_SECONDS) -> np.ndarray:
    """16 kHz mono float32 samples of an audio file, or InputError saying what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return _read_audio(str(path), str(path), max_seconds)


def decode_audio_bytes(
    data: bytes, label: str, max_seconds: float = MAX_SECONDS, max_samples: int = MAX_UPLOAD_DECODED_SAMPLES
) -> np.ndarray:
    """The same for an in-memory file (an upload), or InputError saying what is wrong; decodes at
    most `max_samples` frames x channels, whatever the header claims."""
    if not data:
        raise InputError(f"{label}: the upload is empty")
    return _read_audio(io.BytesIO(data), label, max_seconds, max_samples)


def _read_audio(source: str | io.BytesIO, label: str, max_seconds: float, max_samples: int | None = None) -> np.ndarray:
    try:
        info = soundfile.info(source)
    except (RuntimeError, soundfile.LibsndfileError) as error:
        raise InputError(f"{label}: not a readable audio file ({_first_line(error)})") from None
    if info.frames <= 0 or info.samplerate <= 0:
        raise InputError(f"{label}: the audio is empty")
    if info.frames / info.samplerate > max_seconds:
        raise InputError(
            f"{label}: {info.frames / info.samplerate:.0f} s of audio exceeds the limit of {max_seconds:.0f} s"
        )
    _check_shape(info, label, max_samples)
    if isinstance(source, io.BytesIO):
        source.seek(0)
    # the header's frame count may lie: never decode more than the cap allows, then check what came
    frames = -1 if max_samples is None else max_samples // info.channels + 1
    try:
        data, rate = soundfile.read(source, frames=frames, dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError) as error:
        raise InputError(f"{label}: cannot decode the audio ({_first_line(error)})") from None
    if max_samples is not None and data.size > max_samples:
        raise InputError(f"{label}: the audio decodes to more than {max_samples} samples")
    return validate_samples(to_mono_16k(data, rate), label)


def _check_shape(info, label: str, max_samples: int | None) -> None:
    """Rate, channels and decoded size (frames x channels), before any sample is decoded."""
    if info.samplerate > MAX_RATE:
        raise InputError(f"{label}: a sample rate of {info.samplerate} Hz exceeds the limit of {MAX_RATE} Hz")
    if not 1 <= info.channels <= MAX_CHANNELS:
        raise InputError(f"{label}: {info.channels} channels; at most {MAX_CHANNELS} are accepted")
    if max_samples is not None and info.frames * info.channels > max_samples:
        raise InputError(
            f"{label}: {info.frames} frames x {info.channels} channels exceed the decoded-size limit of {max_samples}"
        )


def to_mono_16k(data: np.ndarray, rate: int) -> np.ndarray:
    """[frames, channels] at `rate` -> float32 [frames'] mono at 16 kHz."""
    mono = data.mean(axis=1) if data.ndim == 2 else data
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE)
    return np.ascontiguousarray(mono, dtype=np.float32)


def validate_samples(samples: np.ndarray, label: str) -> np.ndarray:
    if samples.size == 0:
        raise InputError(f"{label}: the audio is empty")
    if samples.size < MIN_SECONDS * SAMPLE_RATE:
        raise InputError(
            f"{label}: {samples.size / SAMPLE_RATE * 1000:.1f} ms of audio is too short to transcribe "
            f"(at least {MIN_SECONDS * 1000:.0f} ms)"
        )
    if not np.isfinite(samples).all():
        raise InputError(f"{label}: the audio contains NaN or infinite samples")
    if float(np.abs(samples).max()) < SILENCE_PEAK:
        raise InputError(f"{label}: the audio is silent")
    return samples


def split_windows(samples: np.ndarray, window_s: float = WINDOW_SECONDS) -> list[AudioWindow]:
    """Consecutive windows of at most window_s seconds."""
    size = int(window_s * SAMPLE_RATE)
    return [
        AudioWindow(index=i, start_s=start / SAMPLE_RATE, samples=samples[start : start + size])
        for i, start in enumerate(range(0, len(samples), size))
    ]


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
