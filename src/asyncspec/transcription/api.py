"""The library API: `Transcriber(model).transcribe(audio) -> (segments, info)`, the one path from a
recording to timed text that the command line, `bench e2e` and the services use.

    from asyncspec import Transcriber
    with Transcriber("whisper-base") as t:
        segments, info = t.transcribe("talk.mp3")

Segments are produced lazily, window by window, as faster-whisper's are; `info.stats` fills in
as they are consumed. The default method is As²d: a producer process transcribes the recording
with tiny.en from its audio alone, and the target verifies what it published. Every greedy
window equals target-only's (`method="target"`), token for token, timestamps included.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from asyncspec.audio import SAMPLE_RATE, load_audio, validate_samples
from asyncspec.errors import InputError
from asyncspec.transcription.longform import LongformOptions, WindowOutcome, transcribe_windows
from asyncspec.transcription.segments import Segment

LONGFORM_METHODS = ("as2d", "target")
POSITIONAL_SAMPLERS = {"as2d", "target"}  # methods that can decode a fallback window


@dataclass
class TranscriptionStats:
    """What the transcription did, filled in while its segments are consumed."""

    windows: int = 0
    fallbacks: int = 0  # windows decoded again at a higher temperature (and kept so)
    skipped: list[float] = field(default_factory=list)  # start (s) of windows judged silent
    tokens: int = 0
    decodes: int = 0  # decode calls, fallback attempts included
    prefill_s: float = 0.0
    decode_s: float = 0.0
    producer_failure: str | None = None


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float
    method: str
    model: str
    options: LongformOptions
    stats: TranscriptionStats = field(default_factory=TranscriptionStats)
    windows: list[WindowOutcome] = field(default_factory=list)  # for exactness checks and reports


class Transcriber:
    """Whisper long-form transcription on the fixed-shape target engine.

    method: "as2d" (default) or "target". dtype: the target decoder's ("bf16" or "fp32");
    encoder: "auto" (placed by measurement on this machine), "fp32" or "bf16". As²d's producer:
    `producer_model` over `chunk_s` chunks, `budget` candidates per verification."""

    def __init__(
        self,
        model: str = "whisper-base",
        method: str = "as2d",
        *,
        dtype: str = "bf16",
        encoder: str = "auto",
        producer_model: str = "whisper-tiny.en",
        chunk_s: float | None = None,
        budget: int | None = None,
    ):
        from asyncspec.profiling.deployed import deployed_as2d
        from asyncspec.transcription.loading import LONGFORM_PRODUCER, load_speech_target, spawn_producer_early

        if method not in LONGFORM_METHODS:
            raise InputError(f"unknown method {method!r} for long-form transcription; choose {LONGFORM_METHODS}")
        as2d = deployed_as2d(LONGFORM_PRODUCER, chunk_s, budget)
        self.model, self.method, self.chunk_s, self.budget = model, method, as2d.chunk_s, as2d.budget
        self.producer = None
        if method == "as2d":  # spawned first: it loads while the target does
            self.producer = spawn_producer_early(model, LONGFORM_PRODUCER, as2d.chunk_s, producer_model, dtype)
        try:
            self.target = load_speech_target(model, dtype, encoder)
            if method == "as2d" and self.producer is None:
                from asyncspec.transcription.loading import make_producer

                self.producer = make_producer(LONGFORM_PRODUCER, as2d.chunk_s, producer_model, dtype, self.target)
        except BaseException:
            self.close()
            raise

    def transcribe(
        self, audio: str | Path | np.ndarray, options: LongformOptions | None = None, **overrides: Any
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """Segments (lazily) and the info of a recording: a path, or 16 kHz mono float32 samples.
        Keyword overrides are LongformOptions fields (language, temperatures, best_of, thresholds,
        condition_on_previous_text, seed)."""
        options = replace(options or LongformOptions(), **overrides)
        samples = self.load(audio)
        info = TranscriptionInfo(
            language=options.language,
            language_probability=1.0,
            duration=len(samples) / SAMPLE_RATE,
            method=self.method,
            model=self.model,
            options=options,
        )
        return self._segments(samples, options, info), info

    @staticmethod
    def load(audio: str | Path | np.ndarray) -> np.ndarray:
        if isinstance(audio, np.ndarray):
            return validate_samples(np.ascontiguousarray(audio, dtype=np.float32), "audio")
        return load_audio(audio)

    def _segments(self, samples: np.ndarray, options: LongformOptions, info: TranscriptionInfo) -> Iterator[Segment]:
        from asyncspec.ondevice.timed_view import FileCandidates

        files = FileCandidates(self.producer, samples, self.target.timestamp_rules) if self.producer else None
        try:
            for outcome in transcribe_windows(self.target, self._window_decoder(files), samples, options):
                _observe(info, outcome)
                yield from outcome.segments
        finally:
            if files is not None:
                files.close()
                info.stats.producer_failure = files.buffer.failure

    def _window_decoder(self, files):
        from asyncspec.decoding.methods import METHODS
        from asyncspec.decoding.result import DecodeConfig

        method, budget = self.method, self.budget

        def decode(request, config: DecodeConfig, seek_s: float, end_s: float):
            config = replace(config, method_budgets=(("as2d", budget),) if budget else ())
            if config.temperature > 0 and method not in POSITIONAL_SAMPLERS:
                return METHODS["target"](self.target, None, request, config)
            drafter = files.window(seek_s, end_s) if files is not None else None
            return METHODS[method](self.target, drafter, request, config)

        return decode

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
            self.producer = None

    def __enter__(self) -> Transcriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _observe(info: TranscriptionInfo, outcome: WindowOutcome) -> None:
    stats = info.stats
    info.windows.append(outcome)
    stats.windows += 1
    stats.fallbacks += outcome.fell_back
    stats.decodes += len(outcome.attempts)
    if outcome.skipped:
        stats.skipped.append(outcome.seek / 100)
    stats.tokens += len(outcome.chosen.result.tokens)
    for attempt in outcome.attempts:
        stats.prefill_s += attempt.result.stats.prefill_s
        stats.decode_s += attempt.result.stats.decode_s
