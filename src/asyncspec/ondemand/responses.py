"""A transcription as OpenAI's audio API answers it: `response_format` json, text, srt, vtt or
verbose_json (with its segments), and the request fields that shape it (language, prompt,
temperature), validated before anything is queued."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response

from asyncspec.cloudedge.validation import sampling_problem
from asyncspec.errors import InputError
from asyncspec.ondemand.engine import Response as Transcription
from asyncspec.transcription.longform import LongformOptions
from asyncspec.transcription.outputs import to_srt, to_vtt
from asyncspec.transcription.segments import Segment

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MAX_PROMPT_CHARS = 2000  # Whisper keeps the last 223 prompt tokens; far longer text is refused, not cut
SUBTITLE_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt"}
GRANULARITY_FIELDS = ("timestamp_granularities[]", "timestamp_granularities")


def response_format(value: str | None) -> str:
    value = value or "json"
    if value not in FORMATS:
        raise InputError(f"response_format must be one of {', '.join(FORMATS)} (got {value[:40]!r})")
    return value


def language_code(value: str | None, default: str | None) -> str | None:
    """A two- or three-letter code, or `default` (None: detect) when the field is absent."""
    if not value:
        return default
    if not (value.isascii() and value.isalpha() and 2 <= len(value) <= 3):
        raise InputError(f"language must be a two- or three-letter code, got {value[:20]!r}")
    return value.lower()


def longform_options(
    fields: dict[str, str], task: str, defaults: LongformOptions, fmt: str = "json"
) -> LongformOptions:
    """The upload's long-form options from the form over the service's `defaults`: language
    (absent: the default, None = detected), prompt (the initial prompt), temperature (0 or absent:
    the default fallback from 0 up; above 0: that temperature alone), vad_filter (true: only the
    speech Silero VAD finds, as speaches' field), timestamp_granularities (word: word timestamps,
    with verbose_json only, as OpenAI's API), beam_size, patience and length_penalty (faster-whisper's,
    as an extension)."""
    words = "word" in timestamp_granularities(fields.get("timestamp_granularities"), fmt)
    defaults = replace(defaults, word_timestamps=True) if words else defaults
    prompt = fields.get("prompt") or None
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise InputError(f"prompt is {len(prompt)} characters; at most {MAX_PROMPT_CHARS} are accepted")
    language = language_code(fields.get("language"), defaults.language)
    vad = fields.get("vad_filter", "").lower()
    if vad not in ("", "true", "false"):
        raise InputError(f"vad_filter must be true or false, got {vad[:20]!r}")
    options = replace(beam_fields(fields, defaults), language=language, task=task, initial_prompt=prompt)
    if vad:
        options = replace(options, vad_filter=vad == "true")
    value = _number(fields, "temperature", float, 0.0)
    if value == 0:
        return options
    problem = sampling_problem(value, defaults.seed)
    if problem:
        raise InputError(problem)
    return replace(options, temperatures=(value,))


MAX_BEAM_SIZE = 16  # two engine calls' rows a step: a wider beam is a way to buy the service's time
MAX_BATCH_SIZE = 16  # chunks side by side: their caches are the request's memory


def beam_fields(fields: dict[str, str], defaults: LongformOptions) -> LongformOptions:
    """`defaults` with the beam search's and batching's form fields that are present, validated:
    beam_size 1..MAX_BEAM_SIZE, patience in (0, 4], length_penalty in [0, 4], batch_size
    1..MAX_BATCH_SIZE."""
    beam_size = _number(fields, "beam_size", int, defaults.beam_size)
    batch_size = _number(fields, "batch_size", int, defaults.batch_size)
    if batch_size is not None and not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InputError(f"batch_size must be 1 to {MAX_BATCH_SIZE}, got {batch_size}")
    patience = _number(fields, "patience", float, defaults.patience)
    length_penalty = _number(fields, "length_penalty", float, defaults.length_penalty)
    if not 1 <= beam_size <= MAX_BEAM_SIZE:
        raise InputError(f"beam_size must be 1 to {MAX_BEAM_SIZE}, got {beam_size}")
    if not 0 < patience <= 4:
        raise InputError(f"patience must be above 0 and at most 4, got {patience}")
    if not 0 <= length_penalty <= 4:
        raise InputError(f"length_penalty must be 0 to 4, got {length_penalty}")
    return replace(
        defaults, beam_size=beam_size, patience=patience, length_penalty=length_penalty, batch_size=batch_size
    )


def _number(fields: dict[str, str], name: str, kind, default):
    value = fields.get(name)
    if value in (None, ""):
        return default
    try:
        number = kind(value)
    except ValueError:
        raise InputError(f"{name} must be a number, got {value[:40]!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise InputError(f"{name} must be a finite number, got {value[:40]!r}")
    return number


def timestamp_granularities(value: str | None, fmt: str) -> set[str]:
    """The granularities asked for ("segment" when none is), refused unless verbose_json."""
    asked = {part.strip() for part in (value or "").split(",") if part.strip()}
    unknown = asked - {"word", "segment"}
    if unknown:
        raise InputError(f"timestamp_granularities must be word or segment, got {sorted(unknown)[0][:20]!r}")
    if asked and fmt != "verbose_json":
        raise InputError("timestamp_granularities needs response_format=verbose_json")
    return asked or {"segment"}


@functools.cache
def language_names() -> dict[str, str]:
    """Whisper's language code -> name ("en" -> "english"), as verbose_json reports it."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return dict(LANGUAGES)


def render(result: Transcription, fmt: str) -> Response:
    headers = {
        "X-Asyncspec-Method": result.method,
        "X-Asyncspec-Latency-S": f"{result.latency_s:.4f}",
        "X-Asyncspec-Residual-Prepare-S": f"{result.residual_prepare_s:.4f}",
        "X-Asyncspec-TPS": f"{result.tps:.2f}",
    }
    if result.notes:
        headers["X-Asyncspec-Notes"] = " | ".join(result.notes)[:1000].encode("ascii", "replace").decode()
    segments = result.segments or [_whole(result)]
    if fmt == "text":
        return PlainTextResponse(result.text + "\n", headers=headers)
    if fmt in SUBTITLE_TYPES:
        writer = to_srt if fmt == "srt" else to_vtt
        return PlainTextResponse(writer(segments, {}), headers=headers, media_type=SUBTITLE_TYPES[fmt])
    stats = result.as_dict()
    if fmt == "json":
        return JSONResponse({"text": result.text, "asyncspec": stats}, headers=headers)
    body = {
        "task": result.task,
        "language": language_names().get(result.language, result.language),
        "duration": result.audio_s,
        "text": result.text,
        "segments": [_segment(segment) for segment in segments],
        "asyncspec": stats,
    }
    if any(segment.words for segment in segments):
        body["words"] = [{"word": w.word, "start": w.start, "end": w.end} for s in segments for w in s.words or ()]
    return JSONResponse(body, headers=headers)


def done_fields(result: Transcription, fmt: str) -> dict[str, Any]:
    """What a streamed answer's done event carries beside the text: with verbose_json, what
    verbose_json answers (segments, words); always asyncspec's figures."""
    extra: dict[str, Any] = {"asyncspec": result.as_dict()}
    if fmt == "verbose_json":
        segments = result.segments or [_whole(result)]
        extra |= {"language": language_names().get(result.language, result.language), "duration": result.audio_s}
        extra["segments"] = [_segment(segment) for segment in segments]
        if any(segment.words for segment in segments):
            extra["words"] = [{"word": w.word, "start": w.start, "end": w.end} for s in segments for w in s.words or ()]
    return extra


def _whole(result: Transcription) -> Segment:
    """A live request's answer (one window, no timestamps) as one segment over its audio."""
    return Segment(0, 0, 0.0, result.audio_s, result.text, tuple(result.tokens), 0.0, 0.0, 0.0, 0.0)


def _segment(segment: Segment) -> dict[str, Any]:
    fields = ("id", "seek", "start", "end", "text", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob")
    return {name: getattr(segment, name) for name in fields} | {"tokens": list(segment.tokens)}
