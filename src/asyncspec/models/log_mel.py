"""Whisper's input features without transformers: a periodic-Hann STFT (n_fft 400, hop 160,
reflect-padded at both ends), power spectrum, librosa's slaney mel filterbank, log10 floored at
1e-10, clamped to 8 below the maximum and scaled as (x + 4) / 4, the last frame dropped. These are
the features openai-whisper computes and transformers' WhisperFeatureExtractor reproduces;
computing them here keeps transformers (~2.4 s to import on a 2-core EPYC) off the
transcription path.
tests/test_whisper_model.py checks both forms against WhisperFeatureExtractor."""

from __future__ import annotations

import functools
import math

import numpy as np

from asyncspec.audio import SAMPLE_RATE

N_FFT = 400
HOP_LENGTH = 160
WINDOW_SAMPLES = 30 * SAMPLE_RATE  # one Whisper window: 3000 frames
# the slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above
_LINEAR_HZ_PER_MEL = 200.0 / 3.0
_LOG_START_HZ = 1000.0
_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    mel = hz / _LINEAR_HZ_PER_MEL
    start_mel = _LOG_START_HZ / _LINEAR_HZ_PER_MEL
    above = hz >= _LOG_START_HZ
    mel[above] = start_mel + np.log(hz[above] / _LOG_START_HZ) / _LOG_STEP
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = mel * _LINEAR_HZ_PER_MEL
    start_mel = _LOG_START_HZ / _LINEAR_HZ_PER_MEL
    above = mel >= start_mel
    hz[above] = _LOG_START_HZ * np.exp(_LOG_STEP * (mel[above] - start_mel))
    return hz


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels: int, n_fft: int = N_FFT, sampling_rate: int = SAMPLE_RATE) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangular filters spaced evenly in slaney mels from 0 Hz to
    Nyquist, each scaled to unit area (slaney normalisation), as librosa builds them."""
    fft_hz = np.linspace(0.0, sampling_rate / 2, n_fft // 2 + 1)
    edges_mel = np.linspace(0.0, _hz_to_mel(np.array([sampling_rate / 2.0]))[0], n_mels + 2)
    edges_hz = _mel_to_hz(edges_mel)
    widths = np.diff(edges_hz)
    offsets = edges_hz[None, :] - fft_hz[:, None]  # [frequency, edge]
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    bank = np.maximum(0.0, np.minimum(rising, falling))
    bank *= 2.0 / (edges_hz[2:] - edges_hz[:-2])[None, :]
    return np.ascontiguousarray(bank.T, dtype=np.float32)


def log_mel(audio: np.ndarray, n_mels: int, pad_to: int | None = WINDOW_SAMPLES) -> np.ndarray:
    """[1, n_mels, frames] float32 for 16 kHz mono audio, in numpy: the CTranslate2 producer's
    process never imports torch. With `pad_to` (the default: one 30 s window) the audio is cut or
    zero-padded to that many samples first, as Whisper's windows are; with None it keeps its own
    length (frames = samples // 160). Within 1e-4 of log_mel_tensor (FFTs differ in rounding)."""
    samples = _fitted(audio, pad_to)
    padded = np.pad(samples, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH][:-1]
    power = np.abs(np.fft.rfft(frames * _hann(), axis=-1)) ** 2  # [frames, n_fft // 2 + 1]
    mel = mel_filters(n_mels) @ power.T.astype(np.float32)
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0)[None].astype(np.float32)


def log_mel_tensor(audio: np.ndarray, n_mels: int, pad_to: int | None = WINDOW_SAMPLES):
    """The same features as a torch tensor [1, n_mels, frames], computed with torch.stft in float32:
    bitwise what WhisperFeatureExtractor's torch path gives, so the target's windows see exactly
    the input they saw when features came from transformers (a window on the edge of a repetition
    can turn on a 1e-5 difference)."""
    import torch

    samples = torch.from_numpy(_fitted(audio, pad_to))
    window = torch.hann_window(N_FFT)
    spectrum = torch.stft(samples, N_FFT, HOP_LENGTH, window=window, center=True, return_complex=True)
    mel = torch.from_numpy(mel_filters(n_mels)) @ (spectrum[:, :-1].abs() ** 2)
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).unsqueeze(0)


def _fitted(audio: np.ndarray, pad_to: int | None) -> np.ndarray:
    samples = np.ascontiguousarray(audio, dtype=np.float32)
    if pad_to is None:
        return samples
    return np.pad(samples[:pad_to], (0, max(0, pad_to - len(samples))))


@functools.lru_cache(maxsize=1)
def _hann() -> np.ndarray:
    """The periodic Hann window (torch.hann_window's default, and Whisper's)."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
