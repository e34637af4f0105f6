"""`stream=true` on the live endpoint (`POST /v1/stream/transcriptions`): the streamed upload's
events (ondemand/streamed.py, one event loop for both) over a tiny random Whisper."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from asyncspec.ondemand.ingest import file_blocks
from asyncspec.ondemand.service import create_app
from conftest import synthetic_speech, tiny_whisper
from ondemand_helpers import cancellation_seen, decoding_held, make_engine, running_server

LIVE = "/v1/stream/transcriptions"


@pytest.fixture(scope="module")
def target():
    return tiny_whisper(torch.float32, seed=2)


def live_engine(target, seconds: float = 4.0):
    """An engine whose live input (`seconds` of speech, fed at once) is prepared before it returns."""
    engine = make_engine(target, file_blocks(synthetic_speech(seconds), 1.0, "fast"))
    assert engine.preparer.wait_for(int(seconds), timeout=30)
    return engine


def events(reply) -> list[dict]:
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    return [json.loads(line.removeprefix("data: ")) for line in reply.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("fmt", ["json", "verbose_json"])
def test_a_streamed_live_request_sends_deltas_then_done_equal_to_the_unstreamed_answer(target, fmt):
    client = TestClient(create_app(live_engine(target)))
    whole = client.post(LIVE, params={"response_format": fmt}).json()
    streamed = events(client.post(LIVE, params={"response_format": fmt, "stream": "true"}))
    kinds = [e["type"] for e in streamed]
    assert kinds[-1] == "transcript.text.done" and kinds[:-1] and set(kinds[:-1]) == {"transcript.text.delta"}
    done = streamed[-1]
    assert whole["text"] and "".join(e["delta"] for e in streamed[:-1]) == done["text"] == whole["text"]
    assert done["asyncspec"]["window_end_s"] == whole["asyncspec"]["window_end_s"]
    if fmt == "verbose_json":  # the unstreamed answer's fields, beside the text
        assert (done["language"], done["duration"]) == (whole["language"], whole["duration"])
        assert [s["tokens"] for s in done["segments"]] == [s["tokens"] for s in whole["segments"]]


def test_a_live_windows_text_is_handed_over_before_its_job_ends(target):
    """What makes the deltas stream: the worker hands the text over as it commits, before the
    job's answer exists (the done event waits for that answer)."""
    engine = live_engine(target)
    handed: list[tuple[str, bool]] = []
    job = engine.submit_live(None, None, on_text=lambda text: handed.append((text, engine.current.future.done())))
    answer = job.future.result(timeout=60)
    assert handed == [(answer.text, False)]


def test_a_bad_stream_value_is_a_400(target):
    client = TestClient(create_app(live_engine(target, 2.0)))
    refused = (
        ({"stream": "yes"}, "stream must be true or false"),
        ({"stream": "true", "response_format": "vtt"}, "subtitles"),
    )
    for params, problem in refused:
        bad = client.post(LIVE, params=params)
        assert bad.status_code == 400 and problem in bad.json()["error"]["message"]
    assert client.post(LIVE, params={"stream": "false"}).headers["content-type"].startswith("application/json")


def test_a_failing_live_decode_ends_the_stream_with_an_error_event_and_the_service_goes_on(target):
    """Nothing lost silently: the failure is the stream's last event (no done event claims a text);
    were it dropped, the client would read an empty stream and `streamed == [...]` would fail."""
    engine = live_engine(target, 2.0)
    client = TestClient(create_app(engine))
    original, prompt = target.extend, list(target.prompt_ids())

    def failing_extend(state, tokens):
        if list(tokens) != prompt:  # a decoding call, not a prefill
            raise RuntimeError("decoder exploded")
        return original(state, tokens)

    target.extend = failing_extend
    try:
        streamed = events(client.post(LIVE, params={"stream": "true"}))
    finally:
        del target.extend
    assert streamed == [{"type": "error", "error": {"message": "RuntimeError: decoder exploded"}}]
    assert engine.counters.failed == 1
    assert [e["type"] for e in events(client.post(LIVE, params={"stream": "true"}))][-1] == "transcript.text.done"


def test_a_client_that_leaves_a_live_stream_cancels_its_job(target):
    engine = live_engine(target, 2.0)
    with decoding_held(target) as gate, running_server(create_app(engine)) as url:
        with httpx.stream("POST", f"{url}{LIVE}", params={"stream": "true"}, timeout=30) as reply:
            # the event stream's headers come before any text: this is the streamed path
            assert reply.headers["content-type"].startswith("text/event-stream")
        cancellation_seen(engine, gate)  # the client hung up without reading an event
        assert engine.counters.cancelled == 1 and not engine.counters.completed
