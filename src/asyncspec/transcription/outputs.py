"""A transcript's files, in the formats whisper's command line writes: txt, srt, vtt, tsv, json.

Times never go backwards in a subtitle file: a segment that starts before the previous one ended
(Whisper's windows can overlap a little at a seek) starts where that one ended instead.
"""

from __future__ import annotations

import json
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


def monotonic_spans(segments: Sequence[Segment]) -> list[tuple[float, float, str]]:
    """(start, end, text) per segment, clamped so that no time goes backwards."""
    spans, last_end = [], 0.0
    for segment in segments:
        start = max(segment.start, last_end)
        end = max(segment.end, start)
        spans.append((start, end, segment.text.strip()))
        last_end = end
    return spans


def to_txt(segments: Sequence[Segment], info: dict[str, Any]) -> str:
    return "".join(f"{segment.text.strip()}\n" for segment in segments)


def to_srt(segments: Sequence[Segment], info: dict[str, Any]) -> str:
    blocks = [
        f"{index}\n{timestamp(start, ',', True)} --> {timestamp(end, ',', True)}\n{text}\n"
        for index, (start, end, text) in enumerate(monotonic_spans(segments), start=1)
    ]
    return "\n".join(blocks)


def to_vtt(segments: Sequence[Segment], info: dict[str, Any]) -> str:
    cues = [f"{timestamp(start)} --> {timestamp(end)}\n{text}\n" for start, end, text in monotonic_spans(segments)]
    return "WEBVTT\n\n" + "\n".join(cues)


def to_tsv(segments: Sequence[Segment], info: dict[str, Any]) -> str:
    """start, end (integer milliseconds) and text, as whisper writes it."""
    rows = [f"{round(start * 1000)}\t{round(end * 1000)}\t{text}" for start, end, text in monotonic_spans(segments)]
    return "start\tend\ttext\n" + "".join(f"{row}\n" for row in rows)


def to_json(segments: Sequence[Segment], info: dict[str, Any]) -> str:
    text = "".join(segment.text for segment in segments).strip()
    payload = {"text": text, "segments": [segment.as_dict() for segment in segments], **info}
    return json.dumps(payload, indent=1, ensure_ascii=False)


WRITERS: dict[str, Callable[[Sequence[Segment], dict[str, Any]], str]] = {
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
    segments: Sequence[Segment], info: dict[str, Any], audio_path: str | Path, directory: Path, formats: Sequence[str]
) -> list[Path]:
    """<stem>.<format> in `directory` for each format; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in formats:
        path = directory / f"{Path(audio_path).stem}.{name}"
        path.write_text(WRITERS[name](segments, info), encoding="utf-8")
        written.append(path)
    return written
