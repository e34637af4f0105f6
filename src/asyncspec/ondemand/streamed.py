"""A streamed answer (`stream=true`), as OpenAI's audio API streams a transcription: server-sent
events, a `transcript.text.delta` as each piece of text commits, then `transcript.text.done` with
the whole text (and, with verbose_json, the segments). The deltas joined are the done event's text,
which is the unstreamed answer's. An upload's pieces are its segments (the long-form loop yields
them window by window); a live request's are its windows. A request that fails once its stream has
begun ends it with an `error` event (`{"type": "error", "error": {"message"}}`, OpenAI's error
shape) instead of the done event: what an unstreamed request answers as a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from asyncspec.errors import InputError
from asyncspec.ondemand.responses import SUBTITLE_TYPES

POLL_S = 0.05  # how often a waiting stream checks that its client is still there


def stream_requested(value: str | None, fmt: str) -> bool:
    """The `stream` field or query parameter, refused (400) unless true or false, or when true with
    a subtitle format (a cue needs its segment's end, so subtitles cannot stream as text deltas)."""
    value = (value or "").lower()
    if value not in ("", "true", "false"):
        raise InputError(f"stream must be true or false, got {value[:20]!r}")
    if value == "true" and fmt in SUBTITLE_TYPES:
        raise InputError("stream=true answers json, text or verbose_json, not subtitles")
    return value == "true"


def event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def streamed_answer(request: Request, submit: Callable, done_fields: Callable) -> StreamingResponse:
    """The one event stream of uploads and live requests. `submit(on_text)` queues the job (its
    refusals raise before anything is sent) with `on_text(text)` called on the worker thread as
    each piece commits; `done_fields(result)`: what the done event carries beside the text."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[str] = asyncio.Queue()
    job = submit(lambda text: loop.call_soon_threadsafe(pieces.put_nowait, text))
    return StreamingResponse(_events(request, job, pieces, done_fields), media_type="text/event-stream")


async def _events(request: Request, job, pieces: asyncio.Queue[str], done_fields: Callable) -> AsyncIterator[bytes]:
    future = asyncio.wrap_future(job.future)
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # never an unretrieved exception
    # What the deltas have carried: the text without its leading space; a delta's trailing
    # whitespace is held back until more text follows, so the deltas joined are the stripped text.
    text, held = "", ""
    try:
        while True:
            while not pieces.empty():
                piece = pieces.get_nowait()
                piece = held + (piece.lstrip() if not text else piece)
                delta = piece.rstrip()
                held = piece[len(delta) :]
                if delta:
                    text += delta
                    yield event({"type": "transcript.text.delta", "delta": delta})
            if future.done():
                break
            await asyncio.wait({future}, timeout=POLL_S)
            if pieces.empty() and not future.done() and await request.is_disconnected():
                job.cancelled.set()
                return
        if future.exception() is not None:
            error = future.exception()
            yield event({"type": "error", "error": {"message": f"{type(error).__name__}: {error}"}})
            return
        result = future.result()
        yield event({"type": "transcript.text.done", "text": text} | done_fields(result))
    finally:
        if not future.done():
            job.cancelled.set()
