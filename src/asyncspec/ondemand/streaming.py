"""Sustained streaming (seed 000 App. D.6.2): every block is transcribed as soon as it has arrived.

Audio and committed text persist for `reset_s` (12 s), then both reset: a block's request is the
segment's audio so far with the segment's committed text as a forced prefix, so the target only
decodes the new block's words. As²d's producer reads only the newest block's audio (its candidates
then start where the target's new words start); it never sees the target's text.
Per block: queue wait (arrival -> start), processing, completion lag (last sample -> output), active
RTF (target path: encoder + prefill + decoding, over the block's duration) and resource RTF (all
service time, producer drain included), decode throughput. Keeping pace = p95 lag below the block
length + 1 s and no growing backlog.
A block whose transcription raises is recorded (`BlockFailure`: which block, the error), its
context is dropped (the next block starts a fresh segment: its text cannot rest on words that were
never committed), and the next block goes on; the summary counts failures and never calls a run
with a failure one that keeps pace.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from asyncspec.audio import SAMPLE_RATE
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models.base import DecodeRequest
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.ondemand.engine import PreparedTarget
from asyncspec.ondemand.ingest import AudioBlock
from asyncspec.ondemand.prepared_state import PreparedWindow

TOKENS_PER_SECOND_CAP = 8  # read speech runs at 3-4 tokens/s; more means the decoder is looping
MAX_BACKLOG = 64  # blocks waiting beyond this are dropped and counted (memory stays bounded)
TRAILING_BLOCKS = 15  # seed 000 Figure 9 smooths RTF and throughput over at most 15 blocks
GROWTH_LIMIT = 0.005  # queue-wait slope (s per s of input) above which the backlog is growing


@dataclass
class BlockRecord:
    index: int
    start_s: float
    end_s: float
    reset: bool  # first block of a new 12 s context
    arrival_s: float  # seconds since the stream's origin when its last sample arrived
    queue_wait_s: float
    encode_s: float
    prefill_s: float
    decode_s: float
    processing_s: float  # start of encoding -> committed output (producer drain included)
    completion_lag_s: float  # last sample -> committed output
    active_rtf: float
    resource_rtf: float
    decode_tps: float
    n_tokens: int
    capped: bool
    backlog: int  # blocks still waiting when this one started
    text: str


@dataclass
class BlockFailure:
    index: int
    start_s: float
    end_s: float
    error: str  # "ExceptionType: message", the message cut at 300 characters


@dataclass
class Segment:
    """The current context: audio and committed target tokens since the last reset."""

    index: int = -1
    audio: list[np.ndarray] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


class NewestBlockProducer:
    """The As²d producer fed the newest block only (the source view is audio, never target text)."""

    def __init__(self, producer, block_samples: int):
        self.producer, self.block_samples = producer, block_samples

    def start(self, audio: np.ndarray):
        return self.producer.start(audio[-self.block_samples :])

    def finish(self, buffer) -> None:
        self.producer.finish(buffer)


class AutoTranscriber:
    def __init__(
        self,
        target: WhisperBackend,
        drafter: Any,
        method: str,
        config: DecodeConfig,
        block_s: float = 4.0,
        reset_s: float = 12.0,
        language: str = "en",
        on_record=None,
    ):
        self.target, self.method, self.config = target, method, config
        self.block_s, self.reset_s, self.language = block_s, reset_s, language
        self.drafter = NewestBlockProducer(drafter, int(block_s * SAMPLE_RATE)) if method == "as2d" else drafter
        self.on_record = on_record or (lambda record: None)
        self.records: list[BlockRecord] = []
        self.failures: list[BlockFailure] = []
        self.dropped_blocks = 0
        self.origin: float | None = None
        self.finished_at: float | None = None
        self._pending: queue.Queue[AudioBlock | None] = queue.Queue()
        self._segment = Segment()
        self.thread = threading.Thread(target=self._work, name="auto-transcribe", daemon=True)

    def start(self) -> AutoTranscriber:
        self.thread.start()
        return self

    def on_block(self, block: AudioBlock) -> None:
        if self.origin is None:  # the stream's clock: its first sample arrived at arrived - duration
            self.origin = block.arrived - len(block.samples) / SAMPLE_RATE
        if self._pending.qsize() >= MAX_BACKLOG:
            self.dropped_blocks += 1
            return
        self._pending.put(block)

    def end(self) -> None:
        """The input ended: finish the blocks already received, then stop."""
        self._pending.put(None)

    def _work(self) -> None:
        while (block := self._pending.get()) is not None:
            try:
                record = self._transcribe(block, self._pending.qsize())
            except Exception as error:  # one block's failure must not end the transcription of the rest
                self._failed(block, error)
                continue
            self.records.append(record)
            self.on_record(record)
        self.finished_at = time.perf_counter()

    def _failed(self, block: AudioBlock, error: Exception) -> None:
        failure = BlockFailure(block.index, block.start_s, block.end_s, f"{type(error).__name__}: {error}"[:300])
        self.failures.append(failure)
        self._segment = Segment()  # its audio is in the context but its words are not: start afresh
        print(
            f"asyncspec listen: block {block.index} ({block.start_s:.1f}-{block.end_s:.1f} s) failed: {failure.error}",
            file=sys.stderr,
            flush=True,
        )

    def _transcribe(self, block: AudioBlock, backlog: int) -> BlockRecord:
        started = time.perf_counter()
        segment_index = int(block.start_s // self.reset_s)
        reset = segment_index != self._segment.index
        if reset:
            self._segment = Segment(segment_index)
        self._segment.audio.append(block.samples)
        audio = np.concatenate(self._segment.audio)
        seconds = len(block.samples) / SAMPLE_RATE
        cap = int(seconds * TOKENS_PER_SECOND_CAP) + 4
        prompt = self.target.prompt_ids(self.language) + tuple(self._segment.tokens)
        request = DecodeRequest(prompt_ids=prompt, audio=audio, max_new_tokens=cap)
        encoded = self.target.encode_audio(audio)
        encoded_at = time.perf_counter()
        state = self.target.prefill(request, encoded=encoded)
        prefilled_at = time.perf_counter()
        prepared = PreparedWindow(block.index, block.end_s, request, state, prefilled_at - started, prefilled_at)
        target = PreparedTarget(self.target, prepared, threading.Event())
        # METHODS types every drafter as a Decoder; As²d's is a producer (typed in the producer rework)
        result = METHODS[self.method](target, self.drafter, request, self.config)
        finished = time.perf_counter()
        self._segment.tokens += result.tokens
        active = (prefilled_at - started) + result.stats.prefill_s + result.stats.decode_s
        return BlockRecord(
            index=block.index,
            start_s=block.start_s,
            end_s=block.end_s,
            reset=reset,
            arrival_s=block.arrived - (self.origin or block.arrived),
            queue_wait_s=started - block.arrived,
            encode_s=encoded_at - started,
            prefill_s=prefilled_at - encoded_at,
            decode_s=result.stats.decode_s,
            processing_s=finished - started,
            completion_lag_s=finished - block.arrived,
            active_rtf=active / seconds,
            resource_rtf=(finished - started) / seconds,
            decode_tps=result.tps,
            n_tokens=len(result.tokens),
            capped=result.stats.finish_reason == "length",
            backlog=backlog,
            text=self.target.tokenizer.decode(result.tokens).strip(),
        )


def summarize(
    records: list[BlockRecord], block_s: float, audio_s: float, elapsed_s: float, dropped: int, failed: int = 0
) -> dict:
    """Mean, p95 (linear interpolation) and max of each per-block figure, and the keeps-pace verdict."""
    if not records:
        return {"blocks": 0, "failed_blocks": failed, "keeps_pace": False, "reason": "no block was transcribed"}
    figures = {}
    for name in ("queue_wait_s", "processing_s", "completion_lag_s", "active_rtf", "resource_rtf", "decode_tps"):
        values = np.array([getattr(r, name) for r in records])
        figures[name] = {
            "mean": round(float(values.mean()), 4),
            "p95": round(float(np.percentile(values, 95)), 4),
            "max": round(float(values.max()), 4),
        }
    arrival = np.array([r.arrival_s for r in records])
    waits = np.array([r.queue_wait_s for r in records])
    slope = float(np.polyfit(arrival, waits, 1)[0]) if len(records) > 2 and np.ptp(arrival) > 0 else 0.0
    lag_ok = figures["completion_lag_s"]["p95"] < block_s + 1.0
    growing = slope > GROWTH_LIMIT or records[-1].backlog > 1 or dropped > 0
    return {
        "blocks": len(records),
        "audio_s": round(audio_s, 2),
        "elapsed_s": round(elapsed_s, 2),
        "overall_resource_rtf": round(elapsed_s / audio_s, 4) if audio_s else None,
        "final_completion_lag_s": round(records[-1].completion_lag_s, 4),
        "final_queue_wait_s": round(records[-1].queue_wait_s, 4),
        "max_backlog_blocks": max(r.backlog for r in records),
        "queue_wait_slope_s_per_s": round(slope, 5),
        "dropped_blocks": dropped,
        "failed_blocks": failed,
        "capped_outputs": sum(r.capped for r in records),
        "tokens": sum(r.n_tokens for r in records),
        **figures,
        "p95_lag_below_block_plus_1s": lag_ok,
        "backlog_growing": growing,
        "keeps_pace": lag_ok and not growing and not failed,
    }


def records_json(records: list[BlockRecord] | list[BlockFailure]) -> list[dict[str, Any]]:
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()} for r in records]
