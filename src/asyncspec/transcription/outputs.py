"""A transcript's files, in the formats whisper's command line writes: txt, srt, vtt, tsv, json.

Times never go backwards in a subtitle file: a segment that starts before the previous one ended
(Whisper's windows can overlap a little at a seek) starts where that one ended instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asyncspec.transcription.segments import Segment

FORMATS = ("txt", "srt", "vtt", "tsv", "json")


def timestamp(seconds: float, decimal: str = ".", always_hours: bool = False) -> str:
    milliseconds = max(round(seconds * 1000), 0)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1000)
    head = f"{hours:02d}:" if always_hours or hours else ""
    return f"{head}{minutes:02d}:{secs:02d}{decimal}{milliseconds:03d}"


def monotonic_spans(segments: Sequence[Segment], highlight: bool = False) -> list[tuple[float, float, str]]:
    """(start, end, text) per cue, clamped so that no time goes backwards: a cue per segment, or
    with `highlight` (and word timestamps) a cue per word, the segment's text with that word
    underlined, as whisper's --highlight_words writes them."""
    spans, last_end = [], 0.0
    for start, end, text in (cue for segment in segments for cue in _cues(segment, highlight)):
        start = max(start, last_end)
        end = max(end, start)
        spans.append((start, end, text))
        last_end = end
    return spans


def _cues(segment: Segment, highlight: bool) -> list[tuple[float, float, str]]:
    if not (highlight and segment.words):
        return [(segment.start, segment.end, segment.text.strip())]
    words = [word.word for word in segment.words]
    cues, last = [], segment.start
    for index, word in enumerate(segment.words):
        if word.start > last:  # between words: the text without a mark
            cues.append((last, word.start, "".join(words).strip()))
        marked = words[:index] + [re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", words[index])] + words[index + 1 :]
        cues.append((word.start, word.end, "".join(marked).strip()))
        last = word.end
    return cues


def to_txt(segments: Sequence[Segment], info: dict[str, Any]) -> str:
    return "".join(f"{segment.text.strip()}\n" for segment in segments)


def to_srt(segments: Sequence[Segment], info: dict[str, Any], highlight: bool = False) -> str:
    blocks = [
        f"{index}\n{timestamp(start, ',', True)} --> {timestamp(end, ',', True)}\n{text}\n"
        for index, (start, end, text) in enumerate(monotonic_spans(segments, highlight), start=1)
    ]
    return "\n".join(blocks)


def to_vtt(segments: Sequence[Segment], info: dict[str, Any], highlight: bool = False) -> str:
    spans = monotonic_spans(segments, highlight)
    cues = [f"{timestamp(start)} --> {timestamp(end)}\n{text}\n" for start, end, text in spans]
    return "WEBVTT\n\n" + "\n".join(cues)


def to_tsv(segments: Sequence[Segment], info: dict[str, Any]) -> str:
    """start, end (integer milliseconds) and text, as whisper writes it."""
    rows = [f"{round(start * 1000)}\t{round(end * 1000)}\t{text}" for start, end, text in monotonic_spans(segments)]
    return "start\tend\ttext\n" + "".join(f"{row}\n" for row in rows)


def to_json(segments: Sequence[Segment], info: dict[str, Any]) -> str:
    text = "".join(segment.text for segment in segments).strip()
    payload = {"text": text, "segments": [segment.as_dict() for segment in segments], **info}
    return json.dumps(payload, indent=1, ensure_ascii=False)


WRITERS: dict[str, Callable[..., str]] = {
    "txt": to_txt,
    "srt": to_srt,
    "vtt": to_vtt,
    "tsv": to_tsv,
    "json": to_json,
}


def parse_formats(text: str) -> list[str]:
    from asyncspec.errors import InputError

    names = list(FORMATS) if text == "all" else [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in WRITERS]
    if unknown or not names:
        choices = ", ".join(FORMATS)
        raise InputError(f"unknown output format {', '.join(unknown) or repr(text)}; choose from {choices}, all")
    return names


def write_outputs(
    segments: Sequence[Segment],
    info: dict[str, Any],
    audio_path: str | Path,
    directory: Path,
    formats: Sequence[str],
    highlight_words: bool = False,
) -> list[Path]:
    """<stem>.<format> in `directory` for each format; the paths written. highlight_words: SRT and
    VTT get a cue per word (segments with word timestamps)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in formats:
        path = directory / f"{Path(audio_path).stem}.{name}"
        extra = {"highlight": True} if highlight_words and name in ("srt", "vtt") else {}
        path.write_text(WRITERS[name](segments, info, **extra), encoding="utf-8")
        written.append(path)
    return written
