"""The HTTP service on a tiny random Whisper: formats, and every kind of bad input or misuse gets a
clear HTTP error or a clean end — never a crash (the service answers the next request)."""

from __future__ import annotations

import io

import pytest
import soundfile
import torch
from fastapi.testclient import TestClient

from asyncspec.decoding.methods import METHODS
from asyncspec.ondemand.engine import QueueFull, RequestCancelled
from asyncspec.ondemand.ingest import file_blocks, pcm_blocks
from asyncspec.ondemand.service import create_app
from conftest import synthetic_speech, tiny_whisper
from ondemand_helpers import cancellation_seen, decoding_held, make_engine, raw_request, running_server


@pytest.fixture(scope="module")
def target():
    return tiny_whisper(torch.float32, seed=2)


def _wav(seconds=2.0) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, synthetic_speech(seconds), 16_000, format="WAV")
    return out.getvalue()


def test_upload_formats(target):
    """Every response_format of an upload: the recording through the library's long-form path."""
    import srt
    import webvtt

    engine = make_engine(target)
    client = TestClient(create_app(engine))
    files = {"file": ("a.wav", _wav(), "audio/wav")}
    body = client.post("/v1/audio/transcriptions", files=files, data={"model": "whisper-base"}).json()
    assert set(body) == {"text", "asyncspec"} and body["asyncspec"]["windows"] == 1
    text = client.post("/v1/audio/transcriptions", files=files, data={"response_format": "text"})
    assert text.headers["content-type"].startswith("text/plain") and text.text.strip() == body["text"]
    verbose = client.post("/v1/audio/transcriptions", files=files, data={"response_format": "verbose_json"}).json()
    assert verbose["duration"] == 2.0 and verbose["task"] == "transcribe" and verbose["language"] == "english"
    assert "".join(segment["text"] for segment in verbose["segments"]).strip() == body["text"]
    assert verbose["asyncspec"]["n_tokens"] > 0
    subtitles = client.post("/v1/audio/transcriptions", files=files, data={"response_format": "srt"})
    cues = list(srt.parse(subtitles.text))
    assert subtitles.headers["content-type"].startswith("application/x-subrip") and len(cues) >= 1
    vtt = client.post("/v1/audio/transcriptions", files=files, data={"response_format": "vtt"})
    assert vtt.text.startswith("WEBVTT") and len(webvtt.from_string(vtt.text).captions) == len(cues)
    for fmt, field in (("mp3", "response_format"), ("x" * 5, "language"), ("2" * 2, "language"), ("yes", "vad_filter")):
        bad = client.post("/v1/audio/transcriptions", files=files, data={field: fmt})
        assert bad.status_code == 400 and field in bad.json()["error"]["message"]
    long_prompt = client.post("/v1/audio/transcriptions", files=files, data={"prompt": "word " * 500})
    assert long_prompt.status_code == 400 and "prompt" in long_prompt.json()["error"]["message"]
    for data in (
        {"timestamp_granularities[]": "word"},
        {"timestamp_granularities[]": "letter", "response_format": "verbose_json"},
    ):
        bad = client.post("/v1/audio/transcriptions", files=files, data=data)
        assert bad.status_code == 400 and "timestamp_granularities" in bad.json()["error"]["message"]
    timed = client.post(
        "/v1/audio/transcriptions",
        files=files,
        data={"response_format": "verbose_json", "timestamp_granularities[]": ["word", "segment"]},
    ).json()
    assert "".join(w["word"] for w in timed["words"]) == "".join(s["text"] for s in timed["segments"])
    english_only = client.post("/v1/audio/translations", files=files)
    assert english_only.status_code == 400 and "English-only" in english_only.json()["error"]["message"]


def test_an_upload_beam_search_is_the_library_beam_search_and_its_fields_are_bounded(target):
    """beam_size, patience and length_penalty (faster-whisper's, an extension of OpenAI's form):
    the tokens equal the library's own transcription with the same options; out-of-range or
    non-numeric values are a 400 naming the field, and the service answers the next request."""
    from asyncspec.transcription.api import Transcriber

    engine = make_engine(target)
    client = TestClient(create_app(engine))
    files = {"file": ("a.wav", _wav(), "audio/wav")}
    fields = {"response_format": "verbose_json", "beam_size": "4", "patience": "1.5", "length_penalty": "0.5"}
    body = client.post("/v1/audio/transcriptions", files=files, data=fields).json()
    library = Transcriber.from_loaded(target, {}, "tiny")
    samples, _ = soundfile.read(io.BytesIO(_wav()), dtype="float32")  # what the service decodes
    segments, _ = library.transcribe(samples, engine.upload_options, beam_size=4, patience=1.5, length_penalty=0.5)
    assert [s["tokens"] for s in body["segments"]] == [list(s.tokens) for s in segments]
    greedy = client.post("/v1/audio/transcriptions", files=files, data={"response_format": "verbose_json"}).json()
    assert [s["tokens"] for s in greedy["segments"]] != [s["tokens"] for s in body["segments"]]  # the fields count
    for field, value in (("beam_size", "17"), ("beam_size", "0"), ("beam_size", "2.5"), ("patience", "0"),
                         ("patience", "nan"), ("length_penalty", "-1"), ("length_penalty", "inf")):  # fmt: skip
        bad = client.post("/v1/audio/transcriptions", files=files, data={field: value})
        assert bad.status_code == 400 and field in bad.json()["error"]["message"], (field, value)
    assert client.post("/v1/audio/transcriptions", files=files).status_code == 200


def test_non_audio_upload_is_a_400(target):
    client = TestClient(create_app(make_engine(target)))
    files = {"file": ("notes.txt", b"this is not audio at all", "text/plain")}
    response = client.post("/v1/audio/transcriptions", files=files)
    assert response.status_code == 400
    assert "not a readable audio file" in response.json()["error"]["message"]
    empty = client.post("/v1/audio/transcriptions", files={"file": ("e.wav", b"", "audio/wav")})
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
    missing = client.post("/v1/audio/transcriptions", data={"model": "x"})
    assert missing.status_code == 400 and "file" in missing.json()["error"]["message"]


def test_truncated_multipart_body_is_a_400_and_the_server_goes_on(target):
    engine = make_engine(target)
    with running_server(create_app(engine)) as url:
        boundary = "XyZ"
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'.encode()
        body = head + _wav()[:3000]  # the body stops inside the file: no closing boundary
        request = (
            f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        reply = raw_request(url, request)
        assert reply.startswith(b"HTTP/1.1 400") and b"multipart" in reply
        # the declared length is larger than what is sent before the client hangs up
        short = request.replace(f"Content-Length: {len(body)}".encode(), f"Content-Length: {len(body) + 5000}".encode())
        raw_request(url, short, hang_up=True)
        files = {"file": ("a.wav", _wav(), "audio/wav")}
        import httpx

        assert httpx.post(f"{url}/v1/audio/transcriptions", files=files, timeout=60).status_code == 200


def test_request_before_any_audio_is_a_503(target):
    engine = make_engine(target)
    response = TestClient(create_app(engine)).post("/v1/stream/transcriptions")
    assert response.status_code == 503 and "no audio has arrived yet" in response.json()["error"]["message"]
    assert response.headers["retry-after"] == "1"


def test_a_stream_that_stops_ends_cleanly_and_is_still_served(target):
    pcm = (synthetic_speech(2.5) * 32767).astype("<i2").tobytes()[:-1]
    engine = make_engine(target, pcm_blocks(io.BytesIO(pcm), 1.0))
    client = TestClient(create_app(engine))
    status = client.get("/v1/stream/status").json()
    assert status["input"]["ended"] and status["input"]["error"] is None and status["input"]["blocks"] == 3
    response = client.post("/v1/stream/transcriptions", params={"response_format": "verbose_json"})
    assert response.status_code == 200
    body = response.json()
    assert body["duration"] == pytest.approx(2.5, abs=1e-3)
    assert body["asyncspec"]["window_end_s"] == pytest.approx(2.5, abs=1e-3)
    reference = METHODS["target"](target, None, engine.preparer.latest.request).tokens
    assert body["segments"][0]["tokens"] == reference


def test_a_stream_that_ends_without_audio_is_a_503(target):
    engine = make_engine(target, pcm_blocks(io.BytesIO(b""), 1.0))
    response = TestClient(create_app(engine)).post("/v1/stream/transcriptions")
    assert response.status_code == 503 and "ended without audio" in response.json()["error"]["message"]


def test_live_request_answers_from_the_prepared_window(target):
    engine = make_engine(target, file_blocks(synthetic_speech(6.0), 1.0, "fast"))
    engine.preparer.wait_for(6, timeout=30)
    client = TestClient(create_app(engine))
    prepared_before = engine.preparer.prepared_windows
    body = client.post("/v1/stream/transcriptions").json()["asyncspec"]
    # answered from the window prepared before it arrived: none was prepared on its path (a count,
    # not a wall clock), and what it waited is charged as residual (>= 0)
    assert body["prepared"] and body["audio_s"] == 4.0 and engine.preparer.prepared_windows == prepared_before
    assert 0 <= body["residual_prepare_s"] < 2.0
    shorter = client.post("/v1/stream/transcriptions", params={"seconds": 2}).json()["asyncspec"]
    assert not shorter["prepared"] and shorter["audio_s"] == 2.0  # another view: prepared on arrival
    assert client.post("/v1/stream/transcriptions", params={"seconds": 9}).status_code == 400
    assert client.post("/v1/stream/transcriptions", params={"method": "as2d"}).status_code == 400
    memory = client.get("/v1/stream/status").json()["memory"]
    assert memory["rss_mib"] > 0 and memory["audio_window_mib"] > 0 and memory["prepared_state_mib"] > 0


def test_full_queue_is_a_429(target):
    engine = make_engine(target, file_blocks(synthetic_speech(2.0), 1.0, "fast"), max_queue=1, start=False)
    engine.submit_live(None, None)  # the worker is not running: this one waits in the queue
    with pytest.raises(QueueFull):
        engine.submit_live(None, None)
    response = TestClient(create_app(engine)).post("/v1/stream/transcriptions")
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert engine.counters.rejected_full == 2


def test_cancelled_requests_free_the_worker(target):
    engine = make_engine(target, file_blocks(synthetic_speech(2.0), 1.0, "fast"), start=False)
    queued = engine.submit_live(None, None)
    queued.cancelled.set()  # its client went away while it waited
    running = engine.submit_live(None, None)
    calls = []
    original, prompt = target.extend, list(target.prompt_ids())

    def slow_extend(state, tokens):  # cancel this request a few target calls into its decoding
        if list(tokens) != prompt:  # a prefill (the background preparation's) is not a decoding call
            calls.append(1)
            if len(calls) == 3:
                running.cancelled.set()
        return original(state, tokens)

    target.extend = slow_extend
    try:
        engine.start()
        with pytest.raises(RequestCancelled):
            queued.future.result(timeout=30)
        with pytest.raises(RequestCancelled):
            running.future.result(timeout=30)
        assert len(calls) == 3  # no target call after the cancellation
    finally:
        del target.extend
    assert engine.counters.cancelled == 2 and engine.submit_live(None, None).future.result(timeout=60).tokens


def test_client_disconnect_over_http_cancels_the_request(target):
    engine = make_engine(target, file_blocks(synthetic_speech(2.0), 1.0, "fast"))
    with decoding_held(target) as gate, running_server(create_app(engine)) as url:
        request = b"POST /v1/stream/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        raw_request(url, request, read=False, hang_up=True)  # sends, then goes away without the answer
        cancellation_seen(engine, gate)
        assert engine.counters.cancelled == 1


def test_a_streamed_upload_sends_deltas_then_done_equal_to_the_answer(target):
    import json

    client = TestClient(create_app(make_engine(target)))
    files = {"file": ("clip.wav", _wav(6.0), "audio/wav")}
    whole = client.post("/v1/audio/transcriptions", files=files, data={"response_format": "verbose_json"}).json()
    reply = client.post(
        "/v1/audio/transcriptions", files=files, data={"stream": "true", "response_format": "verbose_json"}
    )
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line.removeprefix("data: ")) for line in reply.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    done = events[-1]
    assert "".join(e["delta"] for e in events[:-1]) == done["text"] == whole["text"]
    assert [s["tokens"] for s in done["segments"]] == [s["tokens"] for s in whole["segments"]]
    for data, problem in (({"stream": "yes"}, "stream"), ({"stream": "true", "response_format": "srt"}, "subtitles")):
        bad = client.post("/v1/audio/transcriptions", files=files, data=data)
        assert bad.status_code == 400 and problem in bad.json()["error"]["message"]
