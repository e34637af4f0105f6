"""The on-demand service with the real models (Whisper base bf16 target, CTranslate2 tiny.en
producer) on real speech: responses equal target-only on the same window, also under concurrent
requests and after a client disconnects mid-decode; the official OpenAI client works; sustained
streaming gives the same per-block output with As²d as with target-only."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.ondemand.engine import Engine
from asyncspec.ondemand.ingest import Ingestor, LatestWindow, file_blocks
from asyncspec.ondemand.prepared_state import Preparer, prepare_window
from asyncspec.ondemand.service import create_app
from asyncspec.ondemand.streaming import AutoTranscriber
from ondemand_helpers import raw_request, running_server

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def speech():
    """The LibriVox clips joined: 24.7 s of continuous read speech."""
    return np.concatenate([load_audio(clip.path) for clip in librivox_clips()])


@pytest.fixture(scope="module")
def service(whisper_base, producer, speech):
    window = LatestWindow(12.0)
    preparer = Preparer(whisper_base, window).start()
    ingestor = Ingestor(file_blocks(speech, 4.0, "fast"), window)
    ingestor.subscribe(preparer.on_block)
    engine = Engine(whisper_base, {"as2d": producer}, window, preparer, ingestor, max_queue=4).start()
    ingestor.start().done.wait(30)
    assert preparer.wait_for(window.blocks, 120) is not None
    yield engine
    engine.close()
    preparer.close()


def _reference(target, audio) -> list[int]:
    return METHODS["target"](target, None, prepare_window(target, audio, 0, 0.0).request, DecodeConfig()).tokens


def _recording_reference(target, audio, **options) -> list:
    """An upload's segments as the library transcribes the same samples target-only, without HTTP."""
    from asyncspec.transcription.api import Transcriber

    segments, _ = Transcriber.from_loaded(target, {}, "whisper-base").transcribe(audio, method="target", **options)
    return list(segments)


def test_live_as2d_response_equals_target_only(service, whisper_base):
    from fastapi.testclient import TestClient

    client = TestClient(create_app(service))
    prepared_before = service.preparer.prepared_windows
    body = client.post("/v1/stream/transcriptions", params={"response_format": "verbose_json"}).json()
    stats = body["asyncspec"]
    truth = METHODS["target"](whisper_base, None, service.preparer.latest.request).tokens
    assert body["segments"][0]["tokens"] == truth and len(truth) > 20
    # answered from the window prepared before it arrived: none prepared on its path (a count)
    assert stats["method"] == "as2d" and stats["prepared"] and service.preparer.prepared_windows == prepared_before
    assert stats["residual_prepare_s"] < stats["latency_s"]
    assert 0 <= stats["producer_start_after_arrival_s"] < stats["latency_s"]  # started after arrival
    assert stats["method_stats"]["published"] > 0
    target_only = client.post("/v1/stream/transcriptions", params={"method": "target"}).json()
    assert target_only["text"] == body["text"]


def test_concurrent_uploads_each_equal_target_only(service, whisper_base, speech):
    """Uploads are recordings: As²d through the long-form algorithm, each segment's tokens equal
    the library's target-only transcription of the same samples (the language detected: en)."""
    clips = [load_audio(clip.path) for clip in librivox_clips()[1:5:2]] + [speech[200_000:]]
    expected = [[list(s.tokens) for s in _recording_reference(whisper_base, clip)] for clip in clips]
    with running_server(create_app(service)) as url:
        import io

        import httpx
        import soundfile

        def post(audio):
            data = io.BytesIO()
            soundfile.write(data, audio, 16_000, format="WAV")
            files = {"file": ("clip.wav", data.getvalue(), "audio/wav")}
            reply = httpx.post(
                f"{url}/v1/audio/transcriptions", files=files, data={"response_format": "verbose_json"}, timeout=120
            )
            reply.raise_for_status()
            return reply.json()

        with ThreadPoolExecutor(3) as pool:
            bodies = list(pool.map(post, clips))
    for body, truth in zip(bodies, expected, strict=True):
        assert [segment["tokens"] for segment in body["segments"]] == truth and truth
        assert body["language"] == "english" and body["asyncspec"]["method"] == "as2d"
    assert max(b["asyncspec"]["queue_wait_s"] for b in bodies) > 0.2  # they really queued behind each other


def test_official_openai_client_gets_every_format_and_a_translation(service, whisper_base):
    import openai
    import srt
    import webvtt

    clip = librivox_clips()[1].path
    truth = _recording_reference(whisper_base, load_audio(clip))
    replies = {}
    with running_server(create_app(service)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for fmt in ("json", "text", "srt", "vtt", "verbose_json"):
            with open(clip, "rb") as audio:
                replies[fmt] = client.audio.transcriptions.create(model="whisper-base", file=audio, response_format=fmt)
        with open(clip, "rb") as audio:
            translated = client.audio.translations.create(model="whisper-base", file=audio)
        with open(clip, "rb") as audio:
            timed = client.audio.transcriptions.create(
                model="whisper-base", file=audio, response_format="verbose_json", timestamp_granularities=["word"]
            )
    text = "".join(segment.text for segment in truth).strip()
    assert replies["json"].text == text == replies["text"].strip() and "dispose" in text.lower()
    verbose = replies["verbose_json"]
    assert verbose.language == "english" and [s.text for s in verbose.segments] == [s.text for s in truth]
    cues = list(srt.parse(replies["srt"]))
    assert [cue.content for cue in cues] == [s.text.strip() for s in truth]
    assert [c.text for c in webvtt.from_string(replies["vtt"]).captions] == [cue.content for cue in cues]
    assert translated.text.strip()  # English into English: Whisper's translate task still answers
    truth_words = [
        w for s in _recording_reference(whisper_base, load_audio(clip), word_timestamps=True) for w in s.words
    ]
    assert [(w.word, w.start, w.end) for w in timed.words] == [(w.word, w.start, w.end) for w in truth_words]
    assert "".join(w.word for w in timed.words).strip() == text and len(timed.words) >= len(text.split())


def test_disconnect_mid_decode_stops_the_producer_and_later_requests_stay_exact(service, whisper_base, monkeypatch):
    # As²d decodes a 12 s window in ~0.1 s here: each target call is slowed so that the client's
    # disconnect surely lands mid-decode (the outputs are unchanged, only later)
    extend = whisper_base.extend
    calls = []

    def slow_extend(state, tokens):
        calls.append(len(tokens))
        time.sleep(0.05)
        return extend(state, tokens)

    monkeypatch.setattr(whisper_base, "extend", slow_extend)
    cancelled_before = service.counters.cancelled
    with running_server(create_app(service)) as url:
        request = b"POST /v1/stream/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        host, port = url.removeprefix("http://").split(":")
        import socket

        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(request)
            deadline = time.monotonic() + 30
            while len(calls) < 3 and time.monotonic() < deadline:  # a few target calls into the decode
                time.sleep(0.01)
            assert service.current is not None and len(calls) >= 3
        while service.counters.cancelled == cancelled_before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert service.counters.cancelled == cancelled_before + 1
        assert service.drafters["as2d"].open is None  # the producer was stopped and drained
        after = raw_request(url, request.replace(b"Host: x", b"Host: x\r\nConnection: close"))
    assert after.startswith(b"HTTP/1.1 200")
    truth = METHODS["target"](whisper_base, None, service.preparer.latest.request).tokens
    assert whisper_base.tokenizer.decode(truth).strip().encode() in after


def test_streaming_blocks_equal_target_only(whisper_base, producer, speech):
    outputs = {}
    for method, drafter in (("target", None), ("as2d", producer)):
        auto = AutoTranscriber(whisper_base, drafter, method, DecodeConfig(), block_s=4.0, reset_s=8.0)
        auto.start()
        for block in file_blocks(speech[:192_000], 4.0, "fast"):
            auto.on_block(block)
        auto.end()
        auto.thread.join(300)
        outputs[method] = auto.records
    assert [r.text for r in outputs["as2d"]] == [r.text for r in outputs["target"]]
    assert [r.reset for r in outputs["target"]] == [True, False, True]
    assert all(r.n_tokens > 0 for r in outputs["target"])
    assert all(r.completion_lag_s >= r.processing_s > 0 for r in outputs["as2d"])


def test_wait_for_background_preparation_is_charged_as_residual(whisper_base, speech):
    window = LatestWindow(10.0)
    preparer = Preparer(whisper_base, window).start()
    engine = Engine(whisper_base, {}, window, preparer, default_method="target").start()
    try:
        block = next(file_blocks(speech[:160_000], 10.0, "fast"))
        window.append(block)
        preparer.on_block(block)  # the request arrives right after the block: preparation is running
        response = engine.submit_live(None, None).future.result(timeout=120)
        assert response.prepared and response.residual_prepare_s > 0.05
        assert response.latency_s > response.residual_prepare_s
    finally:
        engine.close()
        preparer.close()


def test_a_streamed_transcription_arrives_segment_by_segment_and_equals_the_answer(service, speech):
    """stream=true through the official client on a 2-minute recording: deltas arrive while later
    windows are still decoding, and joined they are the done event's text and the unstreamed text."""
    import io

    import openai
    import soundfile

    pause = np.zeros(16_000, dtype=np.float32)
    recording = np.concatenate([piece for _ in range(5) for piece in (speech, pause)])  # 128 s
    data = io.BytesIO()
    soundfile.write(data, recording, 16_000, format="WAV")
    with running_server(create_app(service)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        started, deltas, arrivals, done = time.perf_counter(), [], [], None
        for item in client.audio.transcriptions.create(
            model="whisper-base", file=("a.wav", data.getvalue()), stream=True
        ):
            if item.type == "transcript.text.delta":
                deltas.append(item.delta)
                arrivals.append(time.perf_counter() - started)
            elif item.type == "transcript.text.done":
                done = (item.text, time.perf_counter() - started)
        whole = client.audio.transcriptions.create(model="whisper-base", file=("a.wav", data.getvalue()))
    assert done is not None and "".join(deltas) == done[0] == whole.text and len(deltas) >= 5
    assert arrivals[0] < done[1] - 2.0, (arrivals[0], done[1])  # the first text long before the last window
