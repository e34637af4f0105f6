"""Voice activity detection before transcription (`vad_filter=True`, `--vad`), as faster-whisper's:
Silero VAD (the `silero-vad` package, whose model ships inside it) finds the speech regions with
faster-whisper's default settings; they are joined into one recording that the long-form algorithm
transcribes, and every segment's times are mapped back to the original recording. As²d's producer
reads the same joined recording as the target, so it still sees the audio alone."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from asyncspec.audio import SAMPLE_RATE
from asyncspec.transcription.segments import Segment

SEAM_SLACK_S = 1.0  # a segment's share past a seam that is taken for timestamp jitter, not speech


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's VadOptions defaults."""

    threshold: float = 0.5
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400


@dataclass(frozen=True)
class SpeechMap:
    """The speech regions kept, [start, end) in samples of the original recording, in order."""

    regions: tuple[tuple[int, int], ...]

    @functools.cached_property
    def _joined_ends(self) -> list[int]:
        ends, total = [], 0
        for start, end in self.regions:
            total += end - start
            ends.append(total)
        return ends

    @property
    def speech_samples(self) -> int:
        return self._joined_ends[-1] if self.regions else 0

    def to_original(self, seconds: float, is_end: bool = False) -> float:
        """A time of the joined recording -> the same instant of the original. A time on the seam
        of two regions is the first one's end when it ends a segment, else the second's start."""
        if not self.regions:
            return seconds
        joined, index = round(seconds * SAMPLE_RATE), self._region(seconds, is_end)
        before = self._joined_ends[index - 1] if index else 0
        start, end = self.regions[index]
        return min(start + joined - before, end) / SAMPLE_RATE

    def span_to_original(self, start: float, end: float) -> tuple[float, float]:
        """A segment's (start, end) in the original. Where it crosses a seam by less than
        SEAM_SLACK_S (a start timestamp a little before the joined speech of the next region, an end
        a little after), it is kept to the region that holds the rest of it, so a segment does not
        span the silence that was removed."""
        if not self.regions:
            return start, end
        first, last = self._region(start), self._region(end, is_end=True)
        if first < last and self._joined_ends[first] / SAMPLE_RATE - start < SEAM_SLACK_S:
            start, first = self._joined_ends[first] / SAMPLE_RATE, first + 1
        if first < last and end - self._joined_ends[last - 1] / SAMPLE_RATE < SEAM_SLACK_S:
            end = self._joined_ends[last - 1] / SAMPLE_RATE
        return self.to_original(start), max(self.to_original(end, is_end=True), self.to_original(start))

    def _region(self, seconds: float, is_end: bool = False) -> int:
        find = bisect.bisect_left if is_end else bisect.bisect_right
        return min(find(self._joined_ends, round(seconds * SAMPLE_RATE)), len(self.regions) - 1)


@functools.cache
def _silero():
    """The ONNX model where onnxruntime is installed: 0.75 s on a 140 s recording here, against
    1.8 s for the TorchScript one on one thread (the same regions)."""
    import importlib.util

    from silero_vad import load_silero_vad

    return load_silero_vad(onnx=importlib.util.find_spec("onnxruntime") is not None)


def speech_regions(samples: np.ndarray, options: VadOptions | None = None) -> SpeechMap:
    import torch
    from silero_vad import get_speech_timestamps

    options = options or VadOptions()
    found = get_speech_timestamps(
        torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)),
        _silero(),
        threshold=options.threshold,
        sampling_rate=SAMPLE_RATE,
        min_speech_duration_ms=options.min_speech_duration_ms,
        max_speech_duration_s=options.max_speech_duration_s,
        min_silence_duration_ms=options.min_silence_duration_ms,
        speech_pad_ms=options.speech_pad_ms,
    )
    return SpeechMap(tuple((int(region["start"]), int(region["end"])) for region in found))


def speech_only(samples: np.ndarray, options: VadOptions | None = None) -> tuple[np.ndarray, SpeechMap]:
    """(the speech regions joined, their map back to the original)."""
    speech = speech_regions(samples, options)
    pieces = [samples[start:end] for start, end in speech.regions]
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.float32)), speech


def in_original_time(segments: Iterator[Segment], speech) -> Iterator[Segment]:
    """Segments of the joined speech with the original recording's times (vad.SpeechMap), their
    words too."""
    for segment in segments:
        start, end = speech.span_to_original(segment.start, segment.end)
        words = segment.words
        if words:
            spans = [speech.span_to_original(word.start, word.end) for word in words]
            words = [replace(w, start=round(a, 3), end=round(b, 3)) for w, (a, b) in zip(words, spans, strict=True)]
        yield replace(segment, start=round(start, 3), end=round(end, 3), words=words)
