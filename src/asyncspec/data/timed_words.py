"""Speech whose word times are known: Festival synthesises each passage and reports when it placed
every word (the first and last phone of the word in its Segment relation), so word timestamps can
be scored against the synthesiser's own timing rather than against another aligner."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from asyncspec.data.devset import FESTIVAL_PACKAGES, FESTIVAL_VOICES, PRIDE_AND_PREJUDICE
from asyncspec.errors import InputError

_WORD_TIMES = (
    '(mapcar (lambda (w) (format t "%s %f %f\\n" (item.name w)'
    ' (item.feat w "R:SylStructure.daughter1.daughter1.R:Segment.p.end")'
    ' (item.feat w "R:SylStructure.daughtern.daughtern.R:Segment.end")))'
    " (utt.relation.items utt 'Word))"
)


@dataclass(frozen=True)
class TimedWord:
    word: str  # as Festival tokenised it: lower case for most words, no punctuation
    start: float
    end: float


def synthesize_timed(path: Path, text: str, voice: str) -> list[TimedWord]:
    """Write `text` spoken by a Festival voice to `path` (16 kHz WAV) and return its word times."""
    if shutil.which("festival") is None:
        raise InputError(f"festival is not installed (apt-get install {FESTIVAL_PACKAGES})")
    quoted = text.replace("\\", " ").replace('"', " ")
    script = (
        f"{FESTIVAL_VOICES[voice]}\n"
        f"(set! utt (utt.synth (eval (list 'Utterance 'Text \"{quoted}\"))))\n"
        f'(utt.save.wave utt "{path}" \'riff)\n{_WORD_TIMES}\n'
    )
    done = subprocess.run(["festival", "--pipe"], input=script, capture_output=True, text=True, check=True)
    words = []
    for line in done.stdout.splitlines():
        match = re.fullmatch(r"(\S+) (-?[\d.]+) (-?[\d.]+)", line.strip())
        if match:
            words.append(TimedWord(match.group(1), float(match.group(2)), float(match.group(3))))
    if not words or not path.is_file():
        raise RuntimeError(f"festival gave no word times for {text[:40]!r}: {done.stderr[-300:]}")
    return words


def timed_set(directory: Path, passages: int = 6) -> list[tuple[Path, str, list[TimedWord]]]:
    """(wav, text, word times) for the first `passages` Pride and Prejudice passages in each voice."""
    directory.mkdir(parents=True, exist_ok=True)
    found = []
    for voice in FESTIVAL_VOICES:
        for index, text in enumerate(PRIDE_AND_PREJUDICE[:passages]):
            path = directory / f"timed-{voice}-{index}.wav"
            found.append((path, text, synthesize_timed(path, text, voice)))
    return found
