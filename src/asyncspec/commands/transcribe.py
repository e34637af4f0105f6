"""`asyncspec transcribe`: audio files -> windows -> one decode per window and method."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from asyncspec.audio import AudioWindow, load_audio, split_windows
from asyncspec.commands.report import emit, progress, result_record
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models.hf_whisper import WhisperBackend


def file_windows(paths: list[str]) -> list[tuple[str, AudioWindow]]:
    """Every file is read and validated before any decoding starts, so one bad file loses nothing."""
    return [(path, window) for path in paths for window in split_windows(load_audio(path))]


def transcribe_windows(
    target: WhisperBackend,
    windows: list[tuple[str, AudioWindow]],
    methods: list[str],
    config: DecodeConfig,
    language: str = "en",
) -> Iterator[dict]:
    for path, window in progress(windows, len(windows), "transcribe"):
        request = target.request(window.samples, language=language)
        for method in methods:
            result = METHODS[method](target, None, request, config)
            yield result_record(result, target, file=str(path), window=window.index, start_s=window.start_s)


def run(args) -> int:
    from asyncspec.models.registry import load_decoder

    windows = file_windows(args.audio)
    target = load_decoder(args.model, args.dtype)
    if not isinstance(target, WhisperBackend):
        raise SystemExit(f"asyncspec: error: {args.model} is not a speech model")
    config = DecodeConfig(temperature=args.temperature, seed=args.seed)
    texts: dict[str, list[str]] = {}
    for record in transcribe_windows(target, windows, args.methods, config, args.language):
        emit(record, args.json)
        texts.setdefault(record["file"], []).append(record["text"])
    if not args.json and len(windows) > 1:
        for path, parts in texts.items():
            print(f"{Path(path).name}: {' '.join(parts)}")
    return 0
