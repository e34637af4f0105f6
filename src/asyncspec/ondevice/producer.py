"""Target-decoupled producers: persistent worker processes (spawn) that read only the request's
audio and their own history, and publish immutable candidate batches in the target's vocabulary.

The worker is started and its model loaded once; a request's drafting starts when the request
arrives, and requests that have arrived are drafted back to back in arrival order. About a request
the worker receives nothing from the target side until the target has finished it (then a `stop`
so it does not keep drafting a finished request). The sources it drafts with are `sources.py`'s.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection

import numpy as np

from asyncspec.ondevice.buffer import CandidateBuffer
from asyncspec.ondevice.messages import Close, Command, Done, Failed, Ready, Start, Stop
from asyncspec.ondevice.sources import SOURCES, ProducerSpec
from asyncspec.spawning import start_worker

__all__ = ["ProducerProcess", "ProducerSpec", "worker_main"]

# A worker's first load on a machine also measures its encoder's placement (cached after): on a
# 2-core AVX2-only EPYC under load that took over 120 s, as bf16 and int8 are emulated there.
READY_TIMEOUT_S = 600.0


def worker_main(spec: ProducerSpec, commands: Connection, batches: Connection) -> None:
    """The worker process: load once, then draft requests one at a time in arrival order. Starts
    that arrive while a request is drafted queue behind it, so the worker runs ahead through every
    request that has arrived (it reads only their audio) instead of idling until the target asks.
    When its parent goes (a closed pipe) it exits quietly: nobody is left to draft for. Ctrl-C is the
    parent's to handle (it reaches the whole process group): the parent then closes the worker."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _serve(spec, commands, batches)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


def _serve(spec: ProducerSpec, commands: Connection, batches: Connection) -> None:
    started = time.perf_counter()
    source = SOURCES[spec.kind](spec)
    batches.send(Ready(time.perf_counter() - started))
    inbox = _Inbox(commands, batches)
    while (start := inbox.next_start()) is not None:
        received = [("start", time.perf_counter())]
        try:
            source.run(start.request_id, start.audio, batches.send, inbox.stop_watcher(start.request_id, received))
        except Exception as error:  # this request's input broke the source: report it, serve the next one
            batches.send(Failed(start.request_id, f"{type(error).__name__}: {error}"))
        batches.send(Done(start.request_id, time.perf_counter(), tuple(received)))


class _Inbox:
    """The worker's view of its command pipe: queued starts, stops of requests not yet begun, close."""

    def __init__(self, commands: Connection, batches: Connection):
        self.commands, self.batches = commands, batches
        self.queued: deque[Start] = deque()
        self.closed = False

    def next_start(self) -> Start | None:
        """The next request to draft, waiting for one; None once the worker is closed."""
        while not self.closed:
            if self.queued:
                return self.queued.popleft()
            self._take(self.commands.recv())
        return None

    def _take(self, message: Command) -> None:
        if isinstance(message, Close):
            self.closed = True
        elif isinstance(message, Start):
            self.queued.append(message)
        elif isinstance(message, Stop):
            self._skip(message.request_id)  # a stop for a finished request needs nothing

    def _skip(self, request_id: int) -> None:
        """A request stopped before its drafting began is done at once, its audio never read."""
        waiting = [s for s in self.queued if s.request_id == request_id]
        for start in waiting:
            self.queued.remove(start)
            self.batches.send(Done(request_id, time.perf_counter(), ()))

    def stop_watcher(self, request_id: int, received: list) -> Callable[[], bool]:
        """Polled between chunks: whether this request was stopped (or the worker closed). Every
        command that concerns this request is logged with its time (the decoupling test reads the
        log: nothing may reach the worker about a request before the target has finished it);
        starts of later requests queue, stops of them skip them."""
        state = {"stopped": False}

        def stopped() -> bool:
            while not self.closed and not state["stopped"] and self.commands.poll(0):
                message = self.commands.recv()
                if getattr(message, "request_id", request_id) == request_id:
                    received.append((type(message).__name__.lower(), time.perf_counter()))
                if isinstance(message, Stop) and message.request_id == request_id:
                    state["stopped"] = True
                else:
                    self._take(message)
            return self.closed or state["stopped"]

        return stopped


class _Demux:
    """The target side of the worker's one batch pipe, split per request: whichever buffer drains
    the pipe routes every message to its own request's queue, so batches a producer published ahead
    for later requests wait for them instead of being dropped."""

    def __init__(self, pipe: Connection):
        self.pipe = pipe
        self.queues: dict[int, deque] = {}

    def channel(self, request_id: int) -> _RequestChannel:
        self.queues.setdefault(request_id, deque())
        return _RequestChannel(self, request_id)

    def drain(self) -> None:
        while self.pipe.poll(0):
            message = self.pipe.recv()
            queue = self.queues.get(getattr(message, "request_id", None))
            if queue is not None:  # a message of a request already finished and forgotten is dropped
                queue.append(message)

    def forget(self, request_id: int) -> None:
        self.queues.pop(request_id, None)


class _RequestChannel:
    """One request's queue, with the `poll`/`recv` a CandidateBuffer reads."""

    def __init__(self, demux: _Demux, request_id: int):
        self.demux, self.request_id = demux, request_id

    def poll(self, timeout: float = 0.0) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.demux.drain()
            if self.demux.queues.get(self.request_id):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.demux.pipe.poll(min(remaining, 0.05))

    def recv(self) -> object:
        return self.demux.queues[self.request_id].popleft()


class ProducerProcess:
    """The target side's handle on one persistent producer worker.

    A producer is only ever a source of candidates the target verifies, so its failure costs speed,
    never correctness: a worker that errors on a request or dies leaves that request's buffer marked
    `failure` (the target decodes on alone, exactly as target-only), a dead worker is restarted at
    the next request, and both events are counted (`failures`, `restarts`)."""

    def __init__(self, spec: ProducerSpec, wait: bool = True):
        """`wait=False` returns once the worker is spawned, so it loads while the caller loads the
        target; the first `start` (or `ready`) then waits for it."""
        self.spec = spec
        self.failures = 0
        self.restarts = 0
        self._next_id = 0
        self._arrived: dict[int, tuple[np.ndarray, CandidateBuffer]] = {}  # id(audio) -> announced, not started
        os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
        self.load_s = self._launch(wait)

    def _launch(self, wait: bool = True) -> float:
        context = multiprocessing.get_context("spawn")
        self._commands, worker_commands = context.Pipe(duplex=False)[::-1]
        worker_batches, self._batches = context.Pipe(duplex=False)[::-1]
        self._demux = _Demux(self._batches)
        self.process = context.Process(
            target=worker_main,
            args=(self.spec, worker_commands, worker_batches),
            daemon=True,
            name=f"producer-{self.spec.kind}",
        )
        start_worker(self.process)
        self._ready = False
        return self.ready() if wait else 0.0

    def ready(self) -> float:
        """Wait until the worker has loaded its model; its load seconds."""
        if not self._ready:
            self.load_s = self._wait_ready()
            self._ready = True
        return self.load_s

    def _wait_ready(self) -> float:
        try:
            if self._batches.poll(READY_TIMEOUT_S):
                message = self._batches.recv()
                if isinstance(message, Ready):
                    return message.load_s
        except (EOFError, OSError):
            pass  # the worker died while loading
        self.close()
        raise RuntimeError(f"producer {self.spec.kind} did not start (exit code {self.process.exitcode})")

    def arrive(self, audios: list[np.ndarray]) -> None:
        """Requests have arrived that the target will decode later, in this order: their drafting
        is queued now, so the worker runs on into them while the target is still busy with earlier
        ones. `start` with the same audio object then returns the buffer already filling."""
        for audio in audios:
            if id(audio) not in self._arrived:
                self._arrived[id(audio)] = (audio, self._begin(audio))

    def start(self, audio: np.ndarray) -> CandidateBuffer:
        """Begin drafting a request (call at its arrival); returns the buffer it publishes into.
        Never raises: a producer that cannot draft yields a buffer marked failed (target-only)."""
        arrived = self._arrived.pop(id(audio), None)
        return arrived[1] if arrived is not None else self._begin(audio)

    def _begin(self, audio: np.ndarray) -> CandidateBuffer:
        self._next_id += 1
        buffer = CandidateBuffer(self._next_id)
        try:
            if not self.process.is_alive():
                self._restart()
            self.ready()  # its ready message must be read before any batch
            self._send_start(buffer, audio)
        except (RuntimeError, OSError, EOFError) as error:
            self._failed(buffer, f"the producer could not start drafting: {error}")
        return buffer

    def _send_start(self, buffer: CandidateBuffer, audio: np.ndarray) -> None:
        buffer.channel = self._demux.channel(buffer.request_id)
        self._commands.send(Start(buffer.request_id, np.ascontiguousarray(audio, dtype=np.float32)))

    def _restart(self) -> None:
        """A fresh worker; requests that arrived but were not started yet are queued on it again."""
        self.restarts += 1
        self.close()
        self.load_s = self._launch()
        for audio, buffer in self._arrived.values():
            if not buffer.finished:
                self._send_start(buffer, audio)

    def _failed(self, buffer: CandidateBuffer, reason: str) -> None:
        self.failures += 1
        buffer.fail(reason)

    def finish(self, buffer: CandidateBuffer) -> None:
        """The target is done with the request: stop its drafting and drain what is left."""
        if not buffer.finished:
            self._stop_and_drain(buffer)
        if buffer.channel is not None:
            self._demux.forget(buffer.request_id)
        self.failures += buffer.failure is not None

    def _stop_and_drain(self, buffer: CandidateBuffer) -> None:
        try:
            self._commands.send(Stop(buffer.request_id))
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not buffer.finished and time.monotonic() < deadline:
                if buffer.channel.poll(0.5):
                    buffer.accept(buffer.channel.recv())
                elif not self.process.is_alive():
                    raise EOFError("the producer process exited")
        except (EOFError, OSError) as error:
            buffer.fail(f"the producer died ({type(error).__name__}: {error}; exit code {self.process.exitcode})")

    def close(self) -> None:
        try:
            if self.process.is_alive():
                self._commands.send(Close())
                self.process.join(timeout=10)
        except OSError:
            pass  # the pipe is already broken: the worker is gone or going
        if self.process.is_alive():
            self.process.kill()
