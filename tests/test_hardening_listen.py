"""`listen` under hostile uploads: decoded-size bombs and oversized bodies are refused before any
decoding, decoding waits for queue admission, a dead preparation thread fails requests at once,
and Engine.close stops the worker even with a full queue."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import soundfile
import torch
from fastapi.testclient import TestClient

from asyncspec.httpguard import GuardConfig
from asyncspec.ondemand.engine import ServiceUnavailable, Upload
from asyncspec.ondemand.ingest import file_blocks
from asyncspec.ondemand.service import UploadLimits, create_app
from conftest import synthetic_speech, tiny_whisper
from ondemand_helpers import make_engine

SMALL = UploadLimits(max_bytes=200_000)


@pytest.fixture(scope="module")
def target():
    return tiny_whisper(torch.float32, seed=2)


def encoded(samples: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=fmt)
    return out.getvalue()


def upload(client, data: bytes, **fields):
    return client.post("/v1/audio/transcriptions", files={"file": ("a.flac", data, "audio/flac")}, data=fields)


def exact_upload(client, target) -> bool:
    """The upload's segments are the library's long-form transcription of the same audio."""
    from asyncspec.transcription.api import Transcriber
    from asyncspec.transcription.longform import LongformOptions

    audio = synthetic_speech(2.0)
    response = upload(client, encoded(audio, 16_000), response_format="verbose_json")
    segments, _ = Transcriber.from_loaded(target, {}, "tiny").transcribe(audio, LongformOptions(temperatures=(0.0,)))
    reference = [list(segment.tokens) for segment in segments]
    return response.status_code == 200 and [s["tokens"] for s in response.json()["segments"]] == reference


def test_decoded_size_bombs_are_refused_from_the_header(target):
    client = TestClient(create_app(make_engine(target), limits=SMALL))
    bombs = {
        "384000 Hz exceeds": encoded(np.zeros((4000, 8), np.float32), 384_000, "FLAC"),
        "200000 Hz exceeds": encoded(np.zeros(4000, np.float32), 200_000, "FLAC"),
        "16 channels": encoded(np.zeros((100, 16), np.float32), 16_000, "WAV"),
    }
    for reason, data in bombs.items():
        response = upload(client, data)
        assert response.status_code == 400 and reason in response.json()["error"]["message"]
    assert exact_upload(client, target)


def test_the_decoded_sample_cap_counts_frames_times_channels(target):
    limits = UploadLimits(max_samples=16_000 * 2)  # 2 s mono
    client = TestClient(create_app(make_engine(target), limits=limits))
    stereo = encoded(np.tile(synthetic_speech(1.5)[:, None], (1, 2)), 16_000)  # 1.5 s, but 3 s of samples
    response = upload(client, stereo)
    assert response.status_code == 400 and "decoded-size limit" in response.json()["error"]["message"]


def test_an_oversized_body_is_a_413_and_the_service_goes_on(target):
    client = TestClient(create_app(make_engine(target), limits=SMALL))
    response = upload(client, b"\0" * 400_000)
    assert response.status_code == 413
    assert exact_upload(client, target)


@pytest.mark.parametrize("fields", [{"temperature": "nan"}, {"temperature": "1e-45"}, {"language": "x" * 500}])
def test_hostile_fields_are_400s(target, fields):
    client = TestClient(create_app(make_engine(target), limits=SMALL))
    assert upload(client, encoded(synthetic_speech(1.0), 16_000), **fields).status_code == 400


def test_uploads_are_decoded_only_after_queue_admission(target):
    engine = make_engine(target, max_queue=1, start=False)
    engine.submit_upload(Upload(b"not audio", "queued", 600, 10**6), None, None)  # holds the only slot
    client = TestClient(create_app(engine))
    response = upload(client, b"also not audio")
    assert response.status_code == 429  # refused by the queue, never decoded (else: 400 not audio)


def test_api_key_and_host_allow_list_on_listen(target):
    guard = GuardConfig(max_body_bytes=300_000, api_keys=("a-long-enough-key",), allowed_hosts=("testserver",))
    client = TestClient(create_app(make_engine(target), guard=guard))
    assert client.get("/v1/stream/status").status_code == 401
    headers = {"Authorization": "Bearer a-long-enough-key"}
    assert client.get("/v1/stream/status", headers=headers).status_code == 200
    rebound = client.get("/v1/stream/status", headers={**headers, "Host": "evil.example"})
    assert rebound.status_code == 400


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread dies loudly
def test_a_dead_preparation_thread_fails_requests_at_once(target):
    engine = make_engine(target, file_blocks(synthetic_speech(2.0), 1.0, "fast"))
    engine.preparer.wait_for(2, timeout=30)

    def broken():
        raise RuntimeError("simulated defect")

    engine.preparer.window.latest = broken
    engine.preparer.on_block(None)
    engine.preparer.thread.join(10)
    assert not engine.preparer.alive and "simulated defect" in engine.preparer.error
    del engine.preparer.window.latest
    began = time.monotonic()
    job = engine.submit_live(None, None)
    with pytest.raises(ServiceUnavailable, match="preparation thread died"):
        job.future.result(timeout=30)
    assert time.monotonic() - began < 30  # not the 60 s residual wait (loose: holds at load 4)


def test_close_stops_the_worker_even_with_a_full_queue(target):
    engine = make_engine(target, file_blocks(synthetic_speech(4.0), 1.0, "fast"), max_queue=1)
    running = engine.submit_live(None, None)
    deadline = time.monotonic() + 10
    while engine.current is None and time.monotonic() < deadline:
        time.sleep(0.001)
    waiting = engine.submit_live(None, None)  # the queue is full now
    engine.close()
    assert not engine.thread.is_alive()
    with pytest.raises(ServiceUnavailable):
        waiting.future.result(timeout=1)
    assert running.future.done()
