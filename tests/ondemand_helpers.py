"""Shared by the on-demand tests: an engine over a latest window (optionally fed blocks), and a
real uvicorn server on a free loopback port, in a thread."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from asyncspec.ondemand.engine import Engine
from asyncspec.ondemand.ingest import Ingestor, LatestWindow
from asyncspec.ondemand.prepared_state import Preparer
from asyncspec.ports import free_port
from asyncspec.transcription.longform import LongformOptions
from hardening_support import running_in_thread


def make_engine(target, blocks=None, window_s: float = 4.0, max_queue: int = 4, start: bool = True) -> Engine:
    """An on-demand engine (target-only by default) whose window is fed `blocks` before it returns."""
    window = LatestWindow(window_s)
    preparer = Preparer(target, window).start()
    ingestor = None
    if blocks is not None:
        ingestor = Ingestor(blocks, window)
        ingestor.subscribe(preparer.on_block)
    # a random model's windows fail every check: without fallback an upload is one greedy decode a window
    uploads = LongformOptions(temperatures=(0.0,))
    engine = Engine(target, {}, window, preparer, ingestor, max_queue, "target", upload_options=uploads)
    if start:
        engine.start()
    if ingestor is not None:
        ingestor.start().done.wait(10)
    return engine


@contextmanager
def running_server(app):
    """Yields the base URL of a uvicorn server serving `app`; stops it on exit."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    with running_in_thread(server):
        yield f"http://127.0.0.1:{port}"


def raw_request(base_url: str, payload: bytes, read: bool = True, hang_up: bool = False) -> bytes:
    """Send bytes over a plain socket (to send what no HTTP client would), then read the reply;
    with hang_up, close our sending side first (the server sees the client go away)."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(payload)
        if hang_up:
            connection.shutdown(socket.SHUT_WR)
        if not read:
            return b""
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


@contextmanager
def decoding_held(target):
    """The target's decoding waits (at most 10 s) until the yielded gate is set: a request is in
    progress, and stays so, while a test hangs up on it. Restored on exit."""
    gate = threading.Event()
    original = target.extend

    def gated_extend(state, tokens):
        gate.wait(10)
        return original(state, tokens)

    target.extend = gated_extend
    try:
        yield gate
    finally:
        gate.set()
        del target.extend


def cancellation_seen(engine, gate, timeout_s: float = 10.0) -> None:
    """Wait until the running job is flagged as cancelled, let the decode go on, then wait until the
    engine has counted the cancellation."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (engine.current and engine.current.cancelled.is_set()):
        time.sleep(0.02)
    gate.set()
    while time.monotonic() < deadline and not engine.counters.cancelled:
        time.sleep(0.02)
