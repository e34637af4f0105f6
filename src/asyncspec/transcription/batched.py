"""Batched long-form transcription (`batch_size=N`, `--batch-size N`), as faster-whisper's
`BatchedInferencePipeline` runs it: Silero VAD finds the speech with that pipeline's settings
(pauses of 160 ms, speech cut at 30 s), the regions are packed in order into chunks of up to 30 s,
and each chunk is decoded on its own: no conditioning on earlier text (the initial prompt and
hotwords condition every chunk), no seek. N chunks at a time run side by side: their encoder
passes one after another, then their decoding steps in shared calls (decoding/lockstep.py), each
chunk's rows over its own encoder output, so every chunk's result is bitwise the chunk decoded
alone.

Unlike that pipeline, a chunk is decoded with timestamps (segments of a few seconds, for
subtitles, rather than one per chunk), its last segment kept to the chunk's end where the end cut
it, a chunk whose text ends early is followed by a window over the rest of it (greedy Whisper
base can stop with speech left: the sequential algorithm's `resume_after_early_end` rule), and a
chunk that fails faster-whisper's thresholds is decoded again at the next temperatures. Those
windows decode alone, as a window of the sequential algorithm does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from asyncspec.audio import SAMPLE_RATE
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.models.base import DecodeRequest
from asyncspec.transcription.longform import (
    MIN_PROGRESS_S,
    WINDOW_FRAMES,
    LongformOptions,
    WindowDecoder,
    WindowOutcome,
    _choose,
    _decode_with_fallback,
    _encoded_request,
    _is_silent,
    _resume_after_early_end,
    _segments,
    _timed_words,
    level_configs,
    prompt_tokens,
    recording_request,
)
from asyncspec.transcription.segments import FRAMES_PER_SECOND
from asyncspec.transcription.vad import SpeechMap, VadOptions

CHUNK_S = 30.0
# BatchedInferencePipeline's VAD: its own defaults over faster-whisper's VadOptions
BATCH_VAD = VadOptions(min_silence_duration_ms=160, max_speech_duration_s=CHUNK_S)
SAMPLES_PER_FRAME = SAMPLE_RATE // FRAMES_PER_SECOND
CHUNK_SAMPLES = int(CHUNK_S * SAMPLE_RATE)
# windows a chunk can take, the seeds' stride: each early end resumes at least MIN_PROGRESS_S on
MAX_PARTS = int(CHUNK_S / MIN_PROGRESS_S) + 1

# (requests, config) -> each request's result under config, decoded side by side
BatchDecoder = Callable[[list[DecodeRequest], DecodeConfig], list[DecodeResult]]


def chunk_bounds(speech: SpeechMap) -> list[tuple[int, int]]:
    """[start, end) in samples of the joined speech of each chunk: the regions in order, a chunk
    closed where the next region would take it past 30 s (a region longer than that, which the VAD
    settings do not make, is cut into 30 s pieces, not dropped)."""
    bounds: list[tuple[int, int]] = []
    start = end = 0
    for region_start, region_end in speech.regions:
        length = region_end - region_start
        if end - start + length > CHUNK_SAMPLES and end > start:
            bounds.append((start, end))
            start = end
        end += length
        while end - start > CHUNK_SAMPLES:
            bounds.append((start, start + CHUNK_SAMPLES))
            start += CHUNK_SAMPLES
    if end > start:
        bounds.append((start, end))
    return bounds


def transcribe_chunks(
    target,
    decode_batch: BatchDecoder,
    decode_window: WindowDecoder,
    samples: np.ndarray,
    bounds: list[tuple[int, int]],
    options: LongformOptions,
    encode=None,
) -> Iterator[WindowOutcome]:
    """Every chunk of the joined speech `samples` in order, `options.batch_size` at a time, as
    WindowOutcome (its seek: the chunk's first frame in the joined speech). A chunk whose text
    ends early (`resume_after_early_end`: greedy Whisper can stop with speech left) is followed by
    a window over the rest of it, decoded alone, as the sequential algorithm's next window is."""
    if options.language is None:
        raise ValueError("the language must be known (detected) before the first chunk")
    size = 1 if options.batch_size is None else options.batch_size
    if size < 1:
        raise ValueError(f"batch size must be at least 1, got {size}")
    chunks = _Chunks(target, decode_window, samples, options, encode or target.encode_audio)
    for first in range(0, len(bounds), size):
        group = list(range(first, min(first + size, len(bounds))))
        requests, encode_s = zip(*(chunks.request(*bounds[index]) for index in group), strict=True)
        firsts = _first_level(decode_batch, list(requests), options, group)
        for at, index in enumerate(group):
            start, end = bounds[index]
            primed = None if firsts is None else (requests[at], firsts[at])
            outcome = chunks.outcome(start, end, index, 0, (requests[at], encode_s[at]), primed)
            yield outcome
            part = 0
            while outcome.resumed_early:  # ends: each window resumes MIN_PROGRESS_S further on
                start, part = outcome.next_seek * SAMPLES_PER_FRAME, part + 1
                outcome = chunks.outcome(start, end, index, part, chunks.request(start, end), None)
                yield outcome


class _Chunks:
    """Decodes one span of the joined speech as a window of its own (no earlier text, no seek
    past it): its attempts, segments (the last one kept to the span's end where the end cut it)
    and words."""

    def __init__(self, target, decode_window: WindowDecoder, samples: np.ndarray, options: LongformOptions, encode):
        self.target, self.decode_window, self.samples, self.options, self.encode = (
            target, decode_window, samples, options, encode,
        )  # fmt: skip
        self.previous = prompt_tokens(target, options.initial_prompt)
        self.hotwords = prompt_tokens(target, options.hotwords)
        self.windows = self.segments = 0
        self.last_speech_s = 0.0

    def request(self, start: int, end: int):
        """(the span's recording request, carrying its encoder output; the encoder's seconds)."""
        audio = self.samples[start:end]
        request, seconds = _encoded_request(self.target, self.encode, audio, self.previous, self.hotwords, self.options)
        return recording_request(self.target, request, self.options), seconds

    def outcome(self, start: int, end: int, chunk: int, part: int, encoded, primed) -> WindowOutcome:
        target, options = self.target, self.options
        (asked, encode_s), span = encoded, (start / SAMPLE_RATE, end / SAMPLE_RATE)
        seek, frames = start // SAMPLES_PER_FRAME, min(WINDOW_FRAMES, -(-(end - start) // SAMPLES_PER_FRAME))
        request = replace(asked, attention=None)
        seeds = chunk * MAX_PARTS + part  # a chunk's draws are seeded alike whatever else is in its batch
        attempts, draws = _decode_with_fallback(target, self.decode_window, request, span, seeds, options, primed)
        chosen = _choose(attempts, options)
        outcome = WindowOutcome(
            self.windows, seek, frames, chosen, attempts, _is_silent(chosen, options), draws, encode_s
        )
        self.windows += 1
        outcome.next_seek = seek + frames
        if not outcome.skipped:
            outcome.segments, complete = _segments(target, outcome, self.segments, keep_tail=True)
            if options.resume_after_early_end and complete == seek + frames:
                _resume_after_early_end(outcome)
            if options.word_timestamps:
                outcome.segments, self.last_speech_s = _timed_words(target, outcome, options, self.last_speech_s)
            self.segments += len(outcome.segments)
        for attempt in outcome.attempts:
            attempt.attention = None
        return outcome


def _first_level(decode_batch: BatchDecoder, requests, options: LongformOptions, group: list[int]):
    """The group's first temperature decoded side by side: one result per chunk, or None where
    that level samples (each chunk's draws, seeded by chunk, then decode as a window's do)."""
    if options.temperatures[0] > 0:
        return None
    config = level_configs(options, group[0], 0)[0]  # at temperature 0 the seed decides nothing
    return [[result] for result in decode_batch(requests, config)]
