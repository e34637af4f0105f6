"""`listen --auto` loses no work silently: a block whose transcription raises is recorded, reported
in the summary and the JSON, and the blocks after it are still transcribed (before, the exception
ended the transcriber thread: later audio was never transcribed and the summary said nothing)."""

from __future__ import annotations

import time

import numpy as np

from asyncspec.commands.listen import print_auto_summary
from asyncspec.decoding.result import DecodeConfig
from asyncspec.ondemand.ingest import AudioBlock
from asyncspec.ondemand.streaming import AutoTranscriber, BlockRecord, records_json, summarize

BLOCK_S = 1.0


class FlakyTranscriber(AutoTranscriber):
    """The real worker loop; the transcription itself raises on the blocks in `failing`."""

    def __init__(self, failing: set[int]):
        super().__init__(target=None, drafter=None, method="target", config=DecodeConfig(), block_s=BLOCK_S)
        self.failing = failing
        self.segments: list[int] = []

    def _transcribe(self, block: AudioBlock, backlog: int) -> BlockRecord:
        self.segments.append(self._segment.index)
        if block.index in self.failing:
            self._segment.index = 99  # a context the failure must not leave behind
            raise RuntimeError(f"decoder exploded on block {block.index}")
        now = time.perf_counter()
        return BlockRecord(block.index, block.start_s, block.end_s, False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1,
                           now - block.arrived, 0.1, 0.1, 10.0, 3, False, backlog, f"words {block.index}")  # fmt: skip


def blocks(count: int) -> list[AudioBlock]:
    samples = np.zeros(16_000, dtype=np.float32)
    return [AudioBlock(i, i * BLOCK_S, samples, time.perf_counter()) for i in range(count)]


def run(failing: set[int], count: int = 5) -> FlakyTranscriber:
    auto = FlakyTranscriber(failing).start()
    for block in blocks(count):
        auto.on_block(block)
    auto.end()
    auto.thread.join(10)
    assert not auto.thread.is_alive(), "the transcriber thread hung"
    return auto


def test_a_failing_block_is_recorded_and_the_next_blocks_go_on(capsys):
    auto = run({1})
    assert [r.index for r in auto.records] == [0, 2, 3, 4]  # the blocks after the failure were transcribed
    assert [(f.index, f.error) for f in auto.failures] == [(1, "RuntimeError: decoder exploded on block 1")]
    assert auto.segments[2] == -1  # the failed block's context was dropped, not reused
    assert "block 1 (1.0-2.0 s) failed: RuntimeError" in capsys.readouterr().err
    summary = summarize(auto.records, BLOCK_S, 5.0, 5.0, auto.dropped_blocks, len(auto.failures))
    assert summary["failed_blocks"] == 1 and summary["blocks"] == 4 and not summary["keeps_pace"]
    assert records_json(auto.failures) == [{"index": 1, "start_s": 1.0, "end_s": 2.0,
                                            "error": "RuntimeError: decoder exploded on block 1"}]  # fmt: skip
    print_auto_summary(summary | {"load_average_before": (0.0,), "load_average_after": (0.0,)})
    assert "1 block(s) FAILED" in capsys.readouterr().out


def test_negative_control_without_failures_the_summary_reports_none():
    auto = run(set())
    assert len(auto.records) == 5 and auto.failures == []
    summary = summarize(auto.records, BLOCK_S, 5.0, 5.0, 0, 0)
    assert summary["failed_blocks"] == 0 and summary["keeps_pace"]


def test_every_block_failing_still_ends_with_a_summary():
    auto = run({0, 1, 2}, count=3)
    assert auto.records == [] and len(auto.failures) == 3 and auto.finished_at is not None
    assert summarize([], BLOCK_S, 3.0, 3.0, 0, 3) == {
        "blocks": 0, "failed_blocks": 3, "keeps_pace": False, "reason": "no block was transcribed"}  # fmt: skip
