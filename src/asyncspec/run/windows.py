"""Audio files as windows, and windows as decode jobs: (context naming the window, request)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from asyncspec.audio import AudioWindow, load_audio, split_windows
from asyncspec.models.base import DecodeRequest
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.run.report import progress


def file_windows(paths: list[str]) -> list[tuple[str, AudioWindow]]:
    """Every file is read and validated before any decoding starts, so one bad file loses nothing."""
    return [(path, window) for path in paths for window in split_windows(load_audio(path))]


def window_jobs(
    target: WhisperBackend, windows: list[tuple[str, AudioWindow]], language: str = "en"
) -> Iterator[tuple[dict[str, Any], DecodeRequest]]:
    for path, window in progress(windows, len(windows), "transcribe"):
        context = {"file": str(path), "window": window.index, "start_s": window.start_s}
        yield context, target.request(window.samples, language=language)
