"""Requests against the prepared state: a bounded queue and one worker that owns the target.

A request's audio view is fixed at its arrival (the latest window received by then, or its upload).
The worker charges any preparation still missing at that moment to the request as residual
preparation, then decodes with the chosen method from a copy of the prepared state. As²d's producer
is started by the method itself, after the request arrived, never before (seed 000 App. A).
A request whose client went away is skipped if still queued, or stopped at its next target call.

An upload is a recording: it is transcribed with Whisper's long-form algorithm through the library
API (`asyncspec.Transcriber` over this service's target and drafters), so it gets the segments,
timestamps and checks `asyncspec transcribe` gives, and no word is cut at a 30 s boundary.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncspec.audio import SAMPLE_RATE, decode_audio_bytes
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.errors import InputError
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.ondemand.ingest import Ingestor, LatestWindow
from asyncspec.ondemand.method_figures import method_figures
from asyncspec.ondemand.prepared_state import PreparedWindow, Preparer, prepare_window
from asyncspec.ondemand.uploads import upload_transcriber
from asyncspec.transcription.longform import LongformOptions

RESIDUAL_WAIT_S = 60.0  # longest a request waits for the background preparation of its window


class QueueFull(RuntimeError):
    """More requests are waiting than the service accepts (HTTP 429)."""


class ServiceUnavailable(RuntimeError):
    """No audio to answer from yet, or the service is closing (HTTP 503)."""


class RequestCancelled(RuntimeError):
    """The client went away; the request's work was stopped."""


@dataclass(frozen=True)
class Upload:
    """An uploaded file, decoded by the worker only once the request holds a queue slot: decoding
    is the costly part of an upload, so it must not run for requests the queue would refuse."""

    data: bytes
    label: str
    max_seconds: float
    max_samples: int


@dataclass
class Job:
    method: str
    audio: np.ndarray  # the request's fixed audio view (float32, 16 kHz); empty until an upload is decoded
    config: DecodeConfig
    live_version: int | None = None  # live requests: blocks received at arrival
    live_end_s: float | None = None
    language: str = "en"
    upload: Upload | None = None
    longform: Any = None  # uploads: transcription.longform.LongformOptions (language None: detect)
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: Future = field(default_factory=Future)
    # streamed answers: called on the worker thread with each segment's or window's text as it commits
    on_text: Callable[[str], None] | None = None


@dataclass
class Response:
    text: str
    tokens: list[int]
    method: str
    audio_s: float
    latency_s: float  # request arrival -> complete response
    queue_wait_s: float
    residual_prepare_s: float  # preparation of this request's window still missing at its arrival
    tps: float  # body tokens / request-to-completion time
    decode_tps: float  # body tokens / decoding time (after the copied or fresh prefill)
    stages: dict[str, float]
    windows: int = 1
    window_end_s: float | None = None  # live requests: stream time of the window's last sample
    prepared: bool = False  # answered from state prepared in the background
    producer_start_after_arrival_s: float | None = None  # as2d: when its producer started drafting
    finish_reason: str = ""
    method_stats: dict[str, Any] = field(default_factory=dict)  # target calls, acceptance, As²d coverage
    segments: list = field(default_factory=list)  # uploads: transcription.segments.Segment, timed
    language: str = "en"
    language_probability: float = 1.0
    task: str = "transcribe"
    notes: list[str] = field(default_factory=list)  # e.g. a method that could not draft this speech

    def as_dict(self) -> dict[str, Any]:
        hidden = ("tokens", "segments")
        return {k: v for k, v in self.__dict__.items() if k not in hidden} | {"n_tokens": len(self.tokens)}


class PreparedTarget:
    """The target as a method sees it: prefill of the prepared request is a copy of the prepared
    state; every target call first checks whether the request was cancelled."""

    def __init__(self, target: WhisperBackend, prepared: PreparedWindow, cancelled: threading.Event):
        self._target, self._prepared, self._cancelled = target, prepared, cancelled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def prefill(self, request, encoded=None):
        if request is self._prepared.request:
            return self._target.copy_state(self._prepared.state)  # its own KV; cross-attention K/V shared
        return self._target.prefill(request, encoded)

    def extend(self, state, tokens):
        if self._cancelled.is_set():
            raise RequestCancelled("the client disconnected")
        return self._target.extend(state, tokens)


class TrackedProducer:
    """As²d's producer with its open request remembered, so a cancelled request can stop it."""

    def __init__(self, producer):
        self.producer, self.open, self.started_at = producer, None, None

    def start(self, audio):
        self.started_at = time.perf_counter()
        self.open = self.producer.start(audio)
        return self.open

    def finish(self, buffer) -> None:
        self.open = None
        self.producer.finish(buffer)

    def abort(self) -> None:
        if self.open is not None:
            self.finish(self.open)


@dataclass
class EngineCounters:
    accepted: int = 0
    completed: int = 0
    rejected_full: int = 0
    cancelled: int = 0
    failed: int = 0


class Engine:
    def __init__(
        self,
        target: WhisperBackend,
        drafters: dict[str, Any],
        window: LatestWindow,
        preparer: Preparer | None,
        ingestor: Ingestor | None = None,
        max_queue: int = 4,
        default_method: str = "as2d",
        default_config: DecodeConfig | None = None,
        upload_options=None,
    ):
        """upload_options: transcription.longform.LongformOptions every upload starts from (its
        language, task, prompt and temperature set per request); default faster-whisper's."""
        self.target, self.window, self.preparer, self.ingestor = target, window, preparer, ingestor
        self.drafters_raw = drafters
        self.drafters = {name: TrackedProducer(d) if name == "as2d" and d else d for name, d in drafters.items()}
        self.default_method, self.default_config = default_method, default_config or DecodeConfig()
        self.transcriber = upload_transcriber(target, drafters, self.default_config)
        self.upload_options = upload_options or LongformOptions(language=self.transcriber.default_language)
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.counters = EngineCounters()
        self.response_observers: list[Callable[[Response], None]] = []  # each answered request's figures
        self.busy = False
        self.current: Job | None = None  # the job being decoded
        self._closed = False
        self.thread = threading.Thread(target=self._work, name="engine", daemon=True)

    def start(self) -> Engine:
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop the worker: waiting jobs fail with 503 (which also makes room, so the stop signal is
        never lost to a full queue); the job in progress ends at its next target call."""
        self._closed = True
        if self.current is not None:
            self.current.cancelled.set()
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.set_exception(ServiceUnavailable("the service is shutting down"))
        self.queue.put(None)  # the queue is empty now: this cannot block for long
        self.thread.join(timeout=30)

    # -- submission (any thread) --

    def check_method(self, method: str | None) -> str:
        method = method or self.default_method
        if method not in METHODS:
            raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        if method != "target" and self.drafters.get(method) is None:
            raise InputError(f"method {method!r} is not loaded in this service (start it with --method {method})")
        return method

    def submit_upload(self, audio: np.ndarray | Upload, method: str | None, longform=None, on_text=None) -> Job:
        """Decoded samples, or an Upload the worker decodes after admission; transcribed as a
        recording with `longform` (transcription.longform.LongformOptions; default: faster-whisper's,
        the language detected where the model is multilingual). `on_text(text)`: called on the
        worker thread with each segment's text as it commits."""
        if isinstance(audio, Upload):
            upload, samples = audio, np.empty(0, dtype=np.float32)
        else:
            upload, samples = None, audio
        longform = longform or self.upload_options
        job = Job(self.check_method(method), samples, self.default_config, upload=upload, longform=longform)
        job.on_text = on_text
        return self._submit(job)

    def submit_live(
        self, seconds: float | None, method: str | None, config: DecodeConfig | None = None, on_text=None
    ) -> Job:
        """The latest `seconds` of the live input (the whole retained window by default), as received now.
        `on_text(text)`: called on the worker thread with each window's text as it commits."""
        method = self.check_method(method)
        if seconds is not None and not 0 < seconds <= self.window.window_s:
            raise InputError(f"seconds must be in (0, {self.window.window_s:g}], got {seconds}")
        version, end_s, audio = self.window.latest(seconds)
        if version == 0 or not len(audio):
            ended = self.ingestor is not None and self.ingestor.status.ended
            raise ServiceUnavailable("the input stream ended without audio" if ended else "no audio has arrived yet")
        job = Job(method, audio.copy(), config or self.default_config, live_version=version, live_end_s=end_s)
        job.on_text = on_text
        return self._submit(job)

    def _submit(self, job: Job) -> Job:
        if self._closed:
            raise ServiceUnavailable("the service is shutting down")
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            self.counters.rejected_full += 1
            raise QueueFull(f"{self.queue.maxsize} requests are already waiting; retry later") from None
        self.counters.accepted += 1
        return job

    # -- the worker (one thread owns the target) --

    def _work(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            if job.cancelled.is_set():
                self.counters.cancelled += 1
                job.future.set_exception(RequestCancelled("the client disconnected while queued"))
                continue
            self.current = job
            try:
                response = self._run(job)
                self.counters.completed += 1
                for observe in self.response_observers:  # metrics: counted before the client reads it
                    observe(response)
                job.future.set_result(response)
            except RequestCancelled as error:
                self.counters.cancelled += 1
                job.future.set_exception(error)
            except Exception as error:  # a failed request is reported to its client; the service goes on
                self.counters.failed += 1
                job.future.set_exception(error)
            finally:
                self.current = None

    def _run(self, job: Job) -> Response:
        started = time.perf_counter()
        if job.upload is not None:
            upload = job.upload
            job.audio = decode_audio_bytes(upload.data, upload.label, upload.max_seconds, upload.max_samples)
        # a live request's window first: the background preparation may still be finishing it
        windows, residual = self._prepared_windows(job) if job.longform is None else ([], 0.0)
        producer = self.drafters.get(job.method)
        if isinstance(producer, TrackedProducer):
            producer.started_at = None
        if self.preparer is not None:
            self.preparer.requests_idle.clear()
        self.busy = True
        try:
            if job.longform is not None:
                return self._transcribe_recording(job, started)
            results, text = self._decode_windows(job, windows)
        finally:
            self.busy = False
            if self.preparer is not None:
                self.preparer.requests_idle.set()
        prepared = job.live_version is not None and windows[0].version == job.live_version
        return self._response(job, started, results, residual, text, len(windows), prepared)

    def _transcribe_recording(self, job: Job, started: float) -> Response:
        """An upload through the long-form algorithm; stopped at the next target call once cancelled."""

        def check() -> None:
            if job.cancelled.is_set():
                raise RequestCancelled("the client disconnected")

        method = job.method if job.method in self.transcriber.methods else "target"
        lazy, info = self.transcriber.transcribe(job.audio, job.longform, method=method, check=check)
        segments = []
        for segment in lazy:  # window by window, as the long-form loop commits them
            segments.append(segment)
            if job.on_text is not None:
                job.on_text(segment.text)
        results = [w.chosen.result for w in info.windows]
        text = "".join(segment.text for segment in segments).strip()
        response = self._response(job, started, results, 0.0, text, len(info.windows), False)
        response.method, response.segments, response.task = info.method, segments, info.options.task
        response.language, response.language_probability = info.language, info.language_probability
        response.notes = list(info.notes)
        response.method_stats["fallbacks"] = info.stats.fallbacks
        if method != job.method:
            response.notes.append(f"{job.method}: this service's drafts carry no audio time; decoded target-only")
        return response

    def _decode_windows(self, job: Job, windows: list[PreparedWindow]) -> tuple[list[DecodeResult], str]:
        """A live request's windows, each one's text handed to `on_text` as it commits; joined by spaces."""
        results, texts = [], []
        for prepared in windows:
            results.append(self._decode(job, prepared))
            texts.append(self.target.tokenizer.decode(results[-1].tokens).strip())
            if job.on_text is not None:  # the space that joins it to the text before travels with it
                job.on_text(texts[-1] if len(texts) == 1 else " " + texts[-1])
        return results, " ".join(texts).strip()

    def _prepared_windows(self, job: Job) -> tuple[list[PreparedWindow], float]:
        """The request's windows, prepared: from the background when it prepared exactly this view,
        else here (that time is residual preparation, charged to the request)."""
        began = time.perf_counter()
        if self.preparer is not None and not self.preparer.alive:
            raise ServiceUnavailable(f"the background preparation thread died ({self.preparer.error or 'exited'})")
        if job.live_version is not None and self.preparer is not None:
            remaining = max(0.0, RESIDUAL_WAIT_S - (began - job.arrived))
            prepared = self.preparer.wait_for(job.live_version, remaining)
            if prepared and prepared.version == job.live_version and np.array_equal(prepared.request.audio, job.audio):
                return [prepared], time.perf_counter() - began
        windows = [prepare_window(self.target, job.audio, 0, 0.0, job.language)]
        return windows, time.perf_counter() - began

    def _decode(self, job: Job, prepared: PreparedWindow) -> DecodeResult:
        target = PreparedTarget(self.target, prepared, job.cancelled)
        drafter = self.drafters.get(job.method)
        try:
            # METHODS types every drafter as a Decoder; As²d's is a producer (typed in the producer rework)
            return METHODS[job.method](target, drafter, prepared.request, job.config)
        finally:
            if isinstance(drafter, TrackedProducer):
                drafter.abort()  # only does something when the decode was interrupted

    def _response(
        self, job, started, results: list[DecodeResult], residual: float, text: str, windows: int, prepared: bool
    ) -> Response:
        finished = time.perf_counter()
        tokens = [t for r in results for t in r.tokens]
        latency = finished - job.arrived
        decode_s = sum(r.stats.decode_s for r in results)
        stages = {"queue_wait_s": started - job.arrived, "residual_prepare_s": residual}
        for stage in ("prefill", "draft", "align", "verify"):
            stages[f"{stage}_s"] = sum(r.trace.total(stage) for r in results)
        stages["decode_s"] = decode_s
        producer = self.drafters.get(job.method)
        return Response(
            text=text,
            tokens=tokens,
            method=job.method,
            audio_s=len(job.audio) / SAMPLE_RATE,
            latency_s=latency,
            queue_wait_s=started - job.arrived,
            residual_prepare_s=residual,
            tps=len(tokens) / latency if latency > 0 else 0.0,
            decode_tps=len(tokens) / decode_s if decode_s > 0 else 0.0,
            stages={k: round(v, 4) for k, v in stages.items()},
            windows=windows,
            window_end_s=job.live_end_s,
            prepared=prepared,
            producer_start_after_arrival_s=round(producer.started_at - job.arrived, 4)
            if isinstance(producer, TrackedProducer) and producer.started_at
            else None,
            finish_reason=results[-1].stats.finish_reason if results else "",
            method_stats=method_figures(results),
        )
