"""A ZeroMQ frame-level proxy between one edge and the cloud for tests: it lets them observe,
duplicate, delay, drop or inject whole frames (fault injection), with an optional one-way latency
and per-direction rate. The edge connects to `front`; the proxy connects to the cloud. The
byte-level link emulator the benchmarks use (profiles, --link-scale) is `cloudedge/link/proxy.py`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from asyncspec.cloudedge.transport import make_socket

UP, DOWN = "up", "down"

# (direction, frame, time) -> list of (extra delay s, frame) to deliver; [] drops the frame
Fault = Callable[[str, bytes, float], list[tuple[float, bytes]]]


@dataclass
class FrameProxyConfig:
    latency_s: float = 0.0  # one way
    up_bytes_per_s: float | None = None  # None: unlimited
    down_bytes_per_s: float | None = None


@dataclass
class FrameRecord:
    """Every frame that entered the link, in order: (direction, monotonic time, frame)."""

    frames: list[tuple[str, float, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, direction: str, frame: bytes) -> None:
        with self.lock:
            self.frames.append((direction, time.monotonic(), frame))

    def snapshot(self) -> list[tuple[str, float, bytes]]:
        with self.lock:
            return list(self.frames)


class FrameProxy:
    def __init__(self, front: str, cloud: str, config: FrameProxyConfig | None = None, fault: Fault | None = None):
        self.front_address = front
        self.cloud_address = cloud
        self.config = config or FrameProxyConfig()
        self.fault = fault
        self.record = FrameRecord()
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._busy_until = {UP: 0.0, DOWN: 0.0}
        self._heap: list = []
        self._order = itertools.count()
        self._edge: bytes | None = None

    def __enter__(self) -> FrameProxy:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)

    def _schedule(self, direction: str, frame: bytes, now: float) -> None:
        self.record.add(direction, frame)
        deliveries = self.fault(direction, frame, now) if self.fault else [(0.0, frame)]
        rate = self.config.up_bytes_per_s if direction == UP else self.config.down_bytes_per_s
        for extra, payload in deliveries:
            depart = now
            if rate:
                depart = max(now, self._busy_until[direction]) + len(payload) / rate
                self._busy_until[direction] = depart
            heapq.heappush(self._heap, (depart + self.config.latency_s + extra, next(self._order), direction, payload))

    def _run(self) -> None:
        context = zmq.Context.instance()
        front = make_socket(context, zmq.ROUTER, self.front_address, bind=True)
        back = make_socket(context, zmq.DEALER, self.cloud_address, bind=False)
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        self.ready.set()
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, _, direction, payload = heapq.heappop(self._heap)
                    if direction == UP:
                        back.send(payload)
                    elif self._edge is not None:
                        front.send_multipart([self._edge, payload])
                wait = 10 if not self._heap else max(0, min(10, int((self._heap[0][0] - now) * 1000)))
                for socket, _ in poller.poll(wait):
                    parts = socket.recv_multipart()
                    if socket is front:
                        self._edge = parts[0]
                        self._schedule(UP, parts[-1], time.monotonic())
                    else:
                        self._schedule(DOWN, parts[-1], time.monotonic())
        finally:
            front.close(0)
            back.close(0)
