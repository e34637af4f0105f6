"""Bundled real speech: the LibriVox clips of Debian's pocketsphinx-testdata, with transcripts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from asyncspec.errors import InputError

LIBRIVOX_DIR = Path("/usr/share/pocketsphinx/test/data/librivox")


@dataclass(frozen=True)
class Clip:
    path: Path
    transcript: str


def librivox_clips(directory: Path = LIBRIVOX_DIR) -> list[Clip]:
    """The five clips in file order; InputError with the install command if they are absent."""
    return read_transcription(directory / "transcription", directory)


def read_transcription(listing: Path, directory: Path) -> list[Clip]:
    """A pocketsphinx transcription listing (`<s> text </s> (file id)` per line) as WAV clips."""
    if not listing.is_file():
        raise InputError(f"{listing}: not found (apt-get install pocketsphinx-testdata)")
    clips = []
    for line in listing.read_text().splitlines():
        match = re.match(r"\s*(?:<s>)?\s*(.*?)\s*(?:</s>)?\s*\((\S+)\)\s*$", line)
        if match:
            clips.append(Clip(directory / f"{match.group(2)}.wav", match.group(1)))
    return clips
