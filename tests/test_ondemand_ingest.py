"""Ingestion and preparation: blocks, the bounded latest window, streams that stop, prepared state
that decodes exactly like a fresh prefill (tiny random Whisper, no real model)."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import torch

from asyncspec.audio import SAMPLE_RATE
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.errors import InputError
from asyncspec.ondemand.engine import PreparedTarget
from asyncspec.ondemand.ingest import Ingestor, LatestWindow, file_blocks, pcm_blocks
from asyncspec.ondemand.prepared_state import Preparer, prepare_window
from conftest import synthetic_speech, tiny_whisper


def test_window_keeps_only_the_latest_seconds():
    window = LatestWindow(3.0)
    for block in file_blocks(synthetic_speech(10.0), 1.0, "fast"):
        window.append(block)
    version, end_s, audio = window.latest()
    assert (version, end_s) == (10, 10.0)
    assert len(audio) == 3 * SAMPLE_RATE and window.nbytes == audio.nbytes
    assert window.dropped_s == pytest.approx(7.0)
    assert len(window.latest(1.5)[2]) == int(1.5 * SAMPLE_RATE)


def test_window_length_is_checked():
    with pytest.raises(InputError, match="window-s"):
        LatestWindow(45.0)


def test_realtime_pace_releases_blocks_when_their_last_sample_is_due():
    began = time.perf_counter()
    blocks = list(file_blocks(synthetic_speech(0.3), 0.1, "realtime"))
    assert len(blocks) == 3
    assert blocks[-1].arrived - began >= 0.29


def test_pcm_stream_that_stops_mid_block_ends_cleanly():
    samples = (np.sin(np.arange(25_001) / 9.0) * 8000).astype("<i2")
    data = samples.tobytes()[:-1]  # the stream stops inside the last sample
    blocks = list(pcm_blocks(io.BytesIO(data), 1.0, "s16le"))
    assert [len(b.samples) for b in blocks] == [16_000, 9_000]  # the partial block is kept
    assert blocks[1].start_s == 1.0
    np.testing.assert_allclose(blocks[0].samples[:5], samples[:5] / 32768.0)


def test_ingestor_reports_the_end_of_a_stream():
    window = LatestWindow(30.0)
    ingestor = Ingestor(pcm_blocks(io.BytesIO(b"\x01\x00" * 20_000), 1.0), window)
    seen = []
    ingestor.subscribe(seen.append)
    ingestor.start().done.wait(5)
    assert ingestor.status.ended and ingestor.status.error is None
    assert len(seen) == 2 and ingestor.status.seconds == pytest.approx(1.25)


def test_prepared_state_decodes_exactly_like_a_fresh_prefill():
    target = tiny_whisper(torch.float32, seed=3, multilingual=True)
    prepared = prepare_window(target, synthetic_speech(4.0, seed=3), 1, 4.0)
    fresh = METHODS["target"](target, None, prepared.request, DecodeConfig())
    for _ in range(2):  # the prepared state is never modified by a request
        from_prepared = METHODS["target"](PreparedTarget(target, prepared, _never()), None, prepared.request)
        assert from_prepared.tokens == fresh.tokens and len(fresh.tokens) > 5
    assert prepared.state.length == len(prepared.request.prompt_ids)
    copy = target.copy_state(prepared.state)
    assert copy.cache.cross is prepared.state.cache.cross  # shared, read-only
    assert all(a is not b for a, b in zip(copy.cache.keys, prepared.state.cache.keys, strict=True))


def test_preparer_prepares_the_newest_window_in_the_background():
    target = tiny_whisper(torch.float32, seed=1)
    window = LatestWindow(2.0)
    preparer = Preparer(target, window).start()
    try:
        for block in file_blocks(synthetic_speech(5.0), 1.0, "fast"):
            window.append(block)
            preparer.on_block(block)
        prepared = preparer.wait_for(5, timeout=30)
        assert prepared is not None and prepared.version == 5 and prepared.end_s == 5.0
        np.testing.assert_array_equal(prepared.request.audio, window.latest()[2])
        assert prepared.nbytes > prepared.request.audio.nbytes
    finally:
        preparer.close()


def _never():
    import threading

    return threading.Event()
