"""Audio ingestion in blocks: from a file (paced in real time, or as fast as it can be read) or
from a raw PCM byte stream (stdin). The latest window of audio is retained, nothing older."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from asyncspec.audio import SAMPLE_RATE
from asyncspec.errors import InputError

PCM_FORMATS: dict[str, np.dtype] = {"s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}
PACES = ("realtime", "fast")


@dataclass(frozen=True)
class AudioBlock:
    index: int
    start_s: float  # stream time of the block's first sample
    samples: np.ndarray  # float32 [n] at SAMPLE_RATE
    arrived: float  # perf_counter time at which the block's last sample was available

    @property
    def end_s(self) -> float:
        return self.start_s + len(self.samples) / SAMPLE_RATE


def file_blocks(samples: np.ndarray, block_s: float, pace: str) -> Iterator[AudioBlock]:
    """Consecutive blocks of a loaded recording; with pace "realtime" each block is released when its
    last sample would have been captured by a microphone started at the first block."""
    if pace not in PACES:
        raise InputError(f"--pace must be one of {', '.join(PACES)}, got {pace!r}")
    return _paced(samples, _block_size(block_s), pace)  # arguments checked now, not at the first block


def _paced(samples: np.ndarray, size: int, pace: str) -> Iterator[AudioBlock]:
    origin = time.perf_counter()
    for index, start in enumerate(range(0, len(samples), size)):
        chunk = samples[start : start + size]
        if pace == "realtime":
            due = origin + (start + len(chunk)) / SAMPLE_RATE
            time.sleep(max(0.0, due - time.perf_counter()))
        yield AudioBlock(index, start / SAMPLE_RATE, chunk, time.perf_counter())


def pcm_blocks(stream: BinaryIO, block_s: float, pcm_format: str = "s16le") -> Iterator[AudioBlock]:
    """Blocks of raw mono 16 kHz PCM read from a byte stream until it ends. A stream that stops
    mid-block yields the partial block; a trailing partial sample is dropped (counted in the error)."""
    if pcm_format not in PCM_FORMATS:
        raise InputError(f"--pcm-format must be one of {', '.join(PCM_FORMATS)}, got {pcm_format!r}")
    return _pcm(stream, _block_size(block_s), PCM_FORMATS[pcm_format])


def _pcm(stream: BinaryIO, size: int, dtype: np.dtype) -> Iterator[AudioBlock]:
    want = size * dtype.itemsize
    index, position = 0, 0
    while True:
        data = _read_fully(stream, want)
        usable = len(data) - len(data) % dtype.itemsize
        if usable:
            raw = np.frombuffer(data[:usable], dtype=dtype)
            chunk = raw.astype(np.float32) / 32768.0 if dtype.kind == "i" else raw.astype(np.float32)
            yield AudioBlock(index, position / SAMPLE_RATE, chunk, time.perf_counter())
            index, position = index + 1, position + len(chunk)
        if len(data) < want:
            return


def _read_fully(stream: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes; fewer only at the end of the stream (pipes return short reads)."""
    parts, got = [], 0
    while got < size:
        part = stream.read(size - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _block_size(block_s: float) -> int:
    if not block_s > 0:
        raise InputError(f"--block-s must be positive, got {block_s}")
    return int(round(block_s * SAMPLE_RATE))


class LatestWindow:
    """The last `window_s` seconds of the stream (a fixed-size array: memory does not grow)."""

    def __init__(self, window_s: float):
        if not 0 < window_s <= 30.0:
            raise InputError(f"--window-s must be in (0, 30] for Whisper, got {window_s}")
        self.window_s = window_s
        self._samples = np.zeros(0, dtype=np.float32)
        self.capacity = int(round(window_s * SAMPLE_RATE))
        self.end_s = 0.0  # stream time of the last retained sample
        self.blocks = 0  # blocks received so far (the window's version)
        self.dropped_s = 0.0  # audio older than the window, discarded
        self._lock = threading.Lock()

    def append(self, block: AudioBlock) -> None:
        with self._lock:
            joined = np.concatenate([self._samples, block.samples])
            excess = max(0, len(joined) - self.capacity)
            self.dropped_s += excess / SAMPLE_RATE
            self._samples = joined[excess:].copy()
            self.end_s, self.blocks = block.end_s, self.blocks + 1

    def latest(self, seconds: float | None = None) -> tuple[int, float, np.ndarray]:
        """(version, end_s, the last `seconds` of retained audio — all of it by default)."""
        with self._lock:
            size = self.capacity if seconds is None else int(round(seconds * SAMPLE_RATE))
            return self.blocks, self.end_s, self._samples[-size:] if size > 0 else self._samples[:0]

    @property
    def nbytes(self) -> int:
        return self._samples.nbytes


@dataclass
class IngestStatus:
    blocks: int = 0
    seconds: float = 0.0
    ended: bool = False
    error: str | None = None
    last_arrival: float | None = None
    listeners: list[Callable[[AudioBlock], None]] = field(default_factory=list)


class Ingestor:
    """Reads blocks in a background thread into the latest window, then tells each listener."""

    def __init__(self, blocks: Iterator[AudioBlock], window: LatestWindow):
        self.blocks, self.window, self.status = blocks, window, IngestStatus()
        self.thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self.done = threading.Event()
        self._stop = threading.Event()

    def subscribe(self, listener: Callable[[AudioBlock], None]) -> None:
        self.status.listeners.append(listener)

    def start(self) -> Ingestor:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop after the block being read (the input is not drained)."""
        self._stop.set()

    def _run(self) -> None:
        try:
            for block in self.blocks:
                if self._stop.is_set():
                    break
                self.window.append(block)
                self.status.blocks += 1
                self.status.seconds = block.end_s
                self.status.last_arrival = block.arrived
                for listener in self.status.listeners:
                    listener(block)
        except (OSError, ValueError) as error:  # a broken pipe or unreadable stream ends ingestion cleanly
            self.status.error = f"{type(error).__name__}: {error}"
        finally:
            self.status.ended = True
            self.done.set()
