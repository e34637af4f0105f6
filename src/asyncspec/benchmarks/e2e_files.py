"""The files `asyncspec bench e2e` transcribes: a folder of the user's, the long-form set (the
default; `longform-large` adds five recordings) or the short LibriVox files (the clips and 10-25 s
windows joined from them)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from asyncspec.audio import SAMPLE_RATE
from asyncspec.errors import InputError

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".mp3"}
FILE_SETS = ("longform", "longform-large", "short")


@dataclass(frozen=True)
class BenchFile:
    path: Path
    audio_s: float
    transcript: str | None  # None: no reference, no WER for this file


def bench_files(audio_dir: str | None, file_set: str, out: Path) -> list[BenchFile]:
    """--audio DIR, else the built-in set: the long-form recordings, or the short LibriVox files."""
    if audio_dir:
        return directory_files(Path(audio_dir))
    if file_set == "short":
        return librivox_files(out / "audio")
    return longform_files(out / "longform", large=file_set == "longform-large")


def longform_files(folder: Path, large: bool = False) -> list[BenchFile]:
    """The long-form set (data/longform_set.py): 2-3 minute recordings, several voices, pauses;
    `large`, eight of them instead of three (for comparing precisions' WER)."""
    import soundfile

    from asyncspec.data.longform_set import LARGE_RECORDINGS, RECORDINGS
    from asyncspec.data.longform_set import longform_files as built

    pairs = built(folder, LARGE_RECORDINGS if large else RECORDINGS)
    return [BenchFile(path, soundfile.info(str(path)).duration, text) for path, text in pairs]


def directory_files(directory: Path) -> list[BenchFile]:
    """Every audio file under `directory` but hidden ones (an editor's or macOS's `._name.wav` is no
    recording; they are counted and named on stderr), each read and validated before any model
    loads (a bad file is an input error, never a crash halfway through the run)."""
    from asyncspec.audio import load_audio

    if not directory.is_dir():
        raise InputError(f"{directory}: no such directory")
    found = sorted(p for p in directory.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES)
    hidden = [p for p in found if any(part.startswith(".") for part in p.relative_to(directory).parts)]
    if hidden:  # said, never dropped silently
        names = ", ".join(str(p.relative_to(directory)) for p in hidden[:5]) + (" ..." if len(hidden) > 5 else "")
        print(f"{directory}: {len(hidden)} hidden file(s) not benchmarked: {names}", file=sys.stderr)
    paths = [p for p in found if p not in hidden]
    if not paths:
        raise InputError(f"{directory}: no audio files ({', '.join(sorted(AUDIO_SUFFIXES))})")
    return [BenchFile(p, len(load_audio(p)) / SAMPLE_RATE, _transcript_beside(p)) for p in paths]


def _transcript_beside(path: Path) -> str | None:
    text = path.with_suffix(".txt")
    return text.read_text().strip() if text.is_file() else None


def librivox_files(folder: Path) -> list[BenchFile]:
    """The five clips as they ship, then the joined 10-25 s windows written as WAV files, so every
    system reads a file (the joined transcript is the clips' transcripts in the same order)."""
    import soundfile

    from asyncspec.data.librivox import librivox_clips
    from asyncspec.data.windows import librivox_windows

    clips = librivox_clips()
    files = [BenchFile(c.path, soundfile.info(str(c.path)).duration, c.transcript) for c in clips]
    folder.mkdir(parents=True, exist_ok=True)
    for dataset, order, samples in librivox_windows():
        path = folder / f"{dataset}_{order}.wav"
        soundfile.write(str(path), samples, SAMPLE_RATE, subtype="PCM_16")
        transcript = " ".join(clips[int(i)].transcript for i in order.split("+"))
        files.append(BenchFile(path, len(samples) / SAMPLE_RATE, transcript))
    return files
