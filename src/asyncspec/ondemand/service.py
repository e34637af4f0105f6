"""HTTP endpoints (FastAPI): OpenAI-compatible uploads and requests over the live input.

POST /v1/audio/transcriptions   multipart `file` (+ model, language, prompt, response_format,
                                 temperature, and `method` as an extension), as the OpenAI audio API:
                                 the recording through Whisper's long-form algorithm, with segments
POST /v1/audio/translations     the same, translated into English
POST /v1/stream/transcriptions  the latest `seconds` of the live input, from the prepared state
                                 (it and the uploads with `stream=true`: server-sent events as
                                 the text commits, ondemand/streamed.py)
GET  /v1/stream/status          ingestion, preparation, queue and memory
GET  /metrics                   Prometheus metrics (ondemand/metrics.py)
Errors use OpenAI's shape {"error": {"message", "type", "code"}}: 400 bad input (also uploads over
MAX_UPLOAD_S), 429 queue full, 503 no audio yet / closing, 499 (logged only) when the client went away.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect

from asyncspec.audio import MAX_UPLOAD_DECODED_SAMPLES
from asyncspec.errors import InputError
from asyncspec.httpguard import FORM_OVERHEAD_BYTES, Guard, GuardConfig, install_error_handlers
from asyncspec.metrics import add_metrics_route
from asyncspec.ondemand.engine import Engine, Job, QueueFull, RequestCancelled, ServiceUnavailable, Upload
from asyncspec.ondemand.engine import Response as Transcription
from asyncspec.ondemand.memory import memory_report
from asyncspec.ondemand.metrics import ListenMetrics
from asyncspec.ondemand.responses import GRANULARITY_FIELDS, done_fields, language_names, longform_options, render
from asyncspec.ondemand.responses import response_format as parse_format
from asyncspec.ondemand.streamed import stream_requested, streamed_answer

MAX_UPLOAD_BYTES = 32 << 20  # ten minutes of 16-bit stereo at 16 kHz is 38 MB as WAV; compressed far less
MAX_UPLOAD_S = 600.0  # ten minutes: longer uploads belong to the live input
DISCONNECT_POLL_S = 0.05
CLIENT_GONE = 499


@dataclass(frozen=True)
class UploadLimits:
    max_bytes: int = MAX_UPLOAD_BYTES  # the file part
    max_seconds: float = MAX_UPLOAD_S
    max_samples: int = MAX_UPLOAD_DECODED_SAMPLES  # decoded frames x channels


def create_app(
    engine: Engine,
    model_name: str = "whisper-base",
    limits: UploadLimits | None = None,
    guard: GuardConfig | None = None,
):
    """The FastAPI app inside httpguard.Guard (body cap, optional API key and Host allow-list)."""
    limits = limits or UploadLimits()
    guard = guard or GuardConfig(max_body_bytes=limits.max_bytes + FORM_OVERHEAD_BYTES)
    app = FastAPI(title="asyncspec on-demand transcription")
    install_error_handlers(app)
    _map_service_errors(app)

    language_names()  # verbose_json's table, read once at start-up rather than on a request

    async def upload(request: Request, task: str) -> Response:
        fields, data = await _read_upload(request, limits.max_bytes)
        fmt = parse_format(fields.get("response_format"))
        longform = longform_options(fields, task, engine.upload_options, fmt)
        audio = Upload(data, fields.get("filename", "upload"), limits.max_seconds, limits.max_samples)
        if stream_requested(fields.get("stream"), fmt):
            submit = lambda on_text: engine.submit_upload(audio, fields.get("method"), longform, on_text)  # noqa: E731
            return streamed_answer(request, submit, lambda result: done_fields(result, fmt))
        job = engine.submit_upload(audio, fields.get("method"), longform)
        return render(await _finish(request, job), fmt)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        return await upload(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request) -> Response:
        return await upload(request, "translate")

    @app.post("/v1/stream/transcriptions")
    async def live(
        request: Request,
        seconds: float | None = None,
        method: str | None = None,
        response_format: str = "json",
        stream: str | None = None,
    ) -> Response:
        fmt = parse_format(response_format)
        if stream_requested(stream, fmt):
            submit = lambda on_text: engine.submit_live(seconds, method, on_text=on_text)  # noqa: E731
            return streamed_answer(request, submit, lambda result: done_fields(result, fmt))
        job = engine.submit_live(seconds, method)
        return render(await _finish(request, job), fmt)

    @app.get("/v1/stream/status")
    async def status() -> dict[str, Any]:
        return service_status(engine)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "asyncspec"}]}

    _health_routes(app, engine)
    add_metrics_route(app, ListenMetrics(engine).registry)  # inside the Guard: a key if the API needs one
    return Guard(app, guard)


def _health_routes(app: FastAPI, engine: Engine) -> None:
    @app.get("/healthz")
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Ready: the worker that decodes requests runs (the models are loaded before it starts)."""
        running = engine.thread.is_alive()  # it ends when the service closes
        body = {"status": "ready" if running else "not ready"}
        return JSONResponse(body, status_code=200 if running else 503)


def _map_service_errors(app: FastAPI) -> None:
    """The service's own failures as OpenAI-style error bodies with their HTTP status."""

    @app.exception_handler(InputError)
    async def bad_input(_: Request, error: InputError) -> JSONResponse:
        return _error(400, str(error), "invalid_request_error")

    @app.exception_handler(QueueFull)
    async def queue_full(_: Request, error: QueueFull) -> JSONResponse:
        return _error(429, str(error), "rate_limit_exceeded", headers={"Retry-After": "1"})

    @app.exception_handler(ServiceUnavailable)
    async def unavailable(_: Request, error: ServiceUnavailable) -> JSONResponse:
        return _error(503, str(error), "service_unavailable", headers={"Retry-After": "1"})

    @app.exception_handler(RequestCancelled)
    async def client_gone(_: Request, error: RequestCancelled) -> JSONResponse:
        return _error(CLIENT_GONE, str(error), "client_closed_request")

    @app.exception_handler(Exception)
    async def failed(_: Request, error: Exception) -> JSONResponse:
        return _error(500, f"{type(error).__name__}: {error}", "server_error")


async def _read_upload(request: Request, max_bytes: int) -> tuple[dict[str, str], bytes]:
    """The multipart form: a clear 400 when it is malformed, truncated or has no file."""
    try:
        form = await request.form(max_files=1, max_fields=32, max_part_size=max_bytes)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise InputError("the multipart form needs a `file` part with the audio")
        data = await upload.read()
    except MultiPartException as error:
        raise InputError(f"malformed multipart body: {error.message}") from None
    except ClientDisconnect:
        raise InputError("the request body ended before it was complete (client disconnected)") from None
    fields = {key: value for key, value in form.items() if isinstance(value, str)}
    fields["filename"] = upload.filename or "upload"
    # OpenAI's client sends one part per value: timestamp_granularities[]=word, ...=segment
    granularities = [v for key in GRANULARITY_FIELDS for v in form.getlist(key) if isinstance(v, str)]
    fields.pop("timestamp_granularities[]", None)
    if granularities:
        fields["timestamp_granularities"] = ",".join(granularities)
    return fields, data


async def _finish(request: Request, job: Job) -> Transcription:
    """Wait for the worker; if the client disconnects first, cancel the job so its work stops."""
    future = asyncio.wrap_future(job.future)
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # never an unretrieved exception
    while True:
        done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S)
        if done:
            return future.result()
        if await request.is_disconnected():
            job.cancelled.set()
            raise RequestCancelled("the client disconnected")


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


def service_status(engine: Engine) -> dict[str, Any]:
    producer = engine.drafters.get("as2d")
    pid = getattr(getattr(getattr(producer, "producer", None), "process", None), "pid", None)
    return {
        "input": _input_status(engine),
        "window": {
            "seconds": engine.window.window_s,
            "blocks": engine.window.blocks,
            "dropped_s": round(engine.window.dropped_s, 3),
        },
        "prepared": _prepared_status(engine),
        "queue": {"waiting": engine.queue.qsize(), "limit": engine.queue.maxsize, "busy": engine.busy},
        "requests": dict(engine.counters.__dict__),
        "memory": memory_report(engine.target, engine.drafters_raw, engine.window, engine.preparer, pid),
    }


def _input_status(engine: Engine) -> dict[str, Any] | None:
    if engine.ingestor is None:
        return None
    status = engine.ingestor.status
    since = None if status.last_arrival is None else round(time.perf_counter() - status.last_arrival, 3)
    return {
        "blocks": status.blocks,
        "seconds": round(status.seconds, 3),
        "ended": status.ended,
        "error": status.error,
        "since_last_block_s": since,
    }


def _prepared_status(engine: Engine) -> dict[str, Any] | None:
    preparer = engine.preparer
    if preparer is None or preparer.latest is None:
        return None
    latest = preparer.latest
    return {
        "blocks": latest.version,
        "end_s": round(latest.end_s, 3),
        "prepare_s": round(latest.prepare_s, 4),
        "age_s": round(time.perf_counter() - latest.ready_at, 3),
        "prepared_windows": preparer.prepared_windows,
        "skipped_blocks": preparer.skipped_versions,
    }
