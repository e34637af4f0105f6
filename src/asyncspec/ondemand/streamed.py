"""A streamed upload (`stream=true`), as OpenAI's audio API streams a transcription: server-sent
events, a `transcript.text.delta` as each segment commits (the long-form loop yields them window
by window), then `transcript.text.done` with the whole text (and, with verbose_json, the
segments). The deltas joined are the done event's text, which is the unstreamed answer's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from asyncspec.errors import InputError

POLL_S = 0.05  # how often a waiting stream checks that its client is still there


def stream_requested(value: str | None) -> bool:
    value = (value or "").lower()
    if value not in ("", "true", "false"):
        raise InputError(f"stream must be true or false, got {value[:20]!r}")
    return value == "true"


def event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def streamed_upload(request: Request, submit: Callable, done_fields: Callable) -> StreamingResponse:
    """`submit(on_segment)` queues the job (its refusals raise before anything is sent);
    `done_fields(result)`: what the done event carries beside the text."""
    loop = asyncio.get_running_loop()
    segments: asyncio.Queue = asyncio.Queue()
    job = submit(lambda segment: loop.call_soon_threadsafe(segments.put_nowait, segment))
    return StreamingResponse(_events(request, job, segments, done_fields), media_type="text/event-stream")


async def _events(request: Request, job, segments: asyncio.Queue, done_fields: Callable) -> AsyncIterator[bytes]:
    future = asyncio.wrap_future(job.future)
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # never an unretrieved exception
    # What the deltas have carried: the text without its leading space; a delta's trailing
    # whitespace is held back until more text follows, so the deltas joined are the stripped text.
    text, held = "", ""
    try:
        while True:
            while not segments.empty():
                piece = segments.get_nowait().text
                piece = held + (piece.lstrip() if not text else piece)
                delta = piece.rstrip()
                held = piece[len(delta) :]
                if delta:
                    text += delta
                    yield event({"type": "transcript.text.delta", "delta": delta})
            if future.done():
                break
            await asyncio.wait({future}, timeout=POLL_S)
            if segments.empty() and not future.done() and await request.is_disconnected():
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
