"""Emulated asymmetric edge–cloud link: a userspace shaping TCP proxy (asyncio, no root needed).

The edge connects to the proxy's listening address; the proxy connects on to the cloud. Bytes from the
connecting side travel the uplink, bytes back travel the downlink (`client_is_edge=False` swaps them).
Each direction is a serialiser followed by a propagation delay line:

    departs  = max(arrived, previous departure) + bytes / rate      (serialisation, FIFO, no burst)
    delivers = departs + one-way delay                               (pipelined: bytes in flight overlap)

so a message of n bytes sent on an idle link arrives n/rate + delay after it was sent, and a stream
arrives at `rate` however long the delay. Timestamps come from the moment asyncio hands the bytes over, so
a late timer never steals link time. When more than bandwidth x delay + a buffer is queued, the proxy stops
reading, and the sender's TCP window closes, as at a real bottleneck. Rates count TCP payload bytes; a
connection's setup is not delayed. Half-closes (FIN) travel through the delay line like data; a side that
goes away closes the other after what it sent has been delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections import deque
from dataclasses import dataclass, field

from asyncspec.cloudedge.link.profiles import LinkProfile

_EOF = b""  # marker in a delay line: half-close the receiving side
_CLOSE = None  # marker: the sending side is gone; close the receiving side
_SEGMENT_SECONDS = 0.002  # deliver a large write in pieces of about 2 ms of link time
_MIN_SEGMENT, _MAX_SEGMENT = 4096, 256 * 1024
_BUFFER_SECONDS, _MIN_BUFFER = 0.05, 256 * 1024  # bottleneck buffer beyond bandwidth x delay


@dataclass
class DirectionStats:
    bytes_delivered: int = 0
    segments: int = 0


@dataclass
class LinkStats:
    up: DirectionStats = field(default_factory=DirectionStats)
    down: DirectionStats = field(default_factory=DirectionStats)
    connections_total: int = 0
    connections_open: int = 0
    connect_failures: int = 0


class DelayLine:
    """One direction of one connection: serialise at `rate` bytes/s, deliver `delay` seconds later."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rate: float, delay: float, stats: DirectionStats):
        self.loop, self.rate, self.delay, self.stats = loop, rate, delay, stats
        self.segment = int(min(_MAX_SEGMENT, max(_MIN_SEGMENT, rate * _SEGMENT_SECONDS)))
        self.high_water = (rate * delay + max(_MIN_BUFFER, rate * _BUFFER_SECONDS)) if rate < math.inf else math.inf
        self.queue: deque[tuple[float, memoryview | bytes | None]] = deque()
        self.queued_bytes = 0
        self.link_free_at = 0.0  # when the serialiser finishes what it holds
        self.sink: _Endpoint | None = None  # receives what this line delivers
        self.source: asyncio.Transport | None = None  # paused while the line is over its high-water mark
        self._timer: asyncio.TimerHandle | None = None
        self._over_high_water = False  # too much in flight on the link
        self.sink_blocked = False  # the receiving socket is not keeping up (asyncio pause_writing)

    def push(self, data: bytes | None) -> None:
        """Bytes (or an _EOF/_CLOSE marker) that reached the sending end of the link now."""
        now = self.loop.time()
        if not data:  # a marker takes no link time
            self._enqueue(max(now, self.link_free_at) + self.delay, data)
            return
        view = memoryview(data)  # slices without copying
        for start in range(0, len(data), self.segment):
            piece = view[start : start + self.segment]
            self.link_free_at = max(now, self.link_free_at) + len(piece) / self.rate
            self._enqueue(self.link_free_at + self.delay, piece)
            self.queued_bytes += len(piece)
        if self.queued_bytes > self.high_water and not self._over_high_water:
            self._over_high_water = True
            self.update_source()

    def _enqueue(self, deliver_at: float, item: bytes | memoryview | None) -> None:
        self.queue.append((deliver_at, item))
        if self._timer is None:
            self._timer = self.loop.call_at(deliver_at, self._deliver_due)

    def _deliver_due(self) -> None:
        """Write every item whose time has come, in order; one timer for the head keeps FIFO order."""
        self._timer = None
        now = self.loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, item = self.queue.popleft()
            self._write(item)
        if self.queue:
            self._timer = self.loop.call_at(self.queue[0][0], self._deliver_due)
        if self._over_high_water and self.queued_bytes <= self.high_water / 2:
            self._over_high_water = False
            self.update_source()

    def update_source(self) -> None:
        """Read from the sender only while the link has room and the receiver keeps up."""
        source = self.source
        if source is None or source.is_closing():
            return
        if self._over_high_water or self.sink_blocked:
            source.pause_reading()
        else:
            source.resume_reading()

    def _write(self, item: bytes | memoryview | None) -> None:
        sink = self.sink
        transport = sink.transport if sink is not None else None
        writable = transport is not None and not transport.is_closing()
        if item:
            self.queued_bytes -= len(item)
            if writable:
                self.stats.bytes_delivered += len(item)  # before the write: readers may look right after it
                self.stats.segments += 1
                transport.write(item)
        elif item == _EOF:
            if writable and transport.can_write_eof():
                transport.write_eof()
                sink.eof_written = True
                sink.close_if_done()
        elif writable:  # _CLOSE: the sender is gone, and with it anyone to answer
            transport.close()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.queue.clear()


class _Endpoint(asyncio.Protocol):
    """One TCP socket of a proxied connection; what it receives goes into `outgoing`."""

    def __init__(self, connection: _Connection, outgoing: DelayLine, incoming: DelayLine):
        self.connection, self.outgoing, self.incoming = connection, outgoing, incoming
        self.transport: asyncio.Transport | None = None
        self.got_eof = False  # its peer will send nothing more
        self.eof_written = False  # we will send it nothing more

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.outgoing.source = self.transport
        self.incoming.sink = self
        self.connection.endpoint_made(self)

    def data_received(self, data: bytes) -> None:
        self.outgoing.push(data)

    def pause_writing(self) -> None:
        self.incoming.sink_blocked = True
        self.incoming.update_source()

    def resume_writing(self) -> None:
        self.incoming.sink_blocked = False
        self.incoming.update_source()

    def eof_received(self) -> bool:
        self.got_eof = True
        self.outgoing.push(_EOF)
        self.close_if_done()
        return True  # keep our write side open: the peer may still be answered

    def close_if_done(self) -> None:
        """Both directions half-closed: nothing more can pass, so release the socket."""
        if self.got_eof and self.eof_written and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.incoming.cancel()  # nothing more can reach this side
        self.outgoing.push(_CLOSE)
        self.connection.endpoint_lost(self)


class _Connection:
    """A client connection and its upstream connection, joined by an uplink and a downlink DelayLine."""

    def __init__(self, link: ShapingProxy):
        self.link = link
        loop = link.loop
        profile = link.profile
        up = DelayLine(loop, profile.up_bytes_per_s, profile.up_delay_ms / 1000, link.stats.up)
        down = DelayLine(loop, profile.down_bytes_per_s, profile.down_delay_ms / 1000, link.stats.down)
        to_server, to_client = (up, down) if link.client_is_edge else (down, up)
        self.client = _Endpoint(self, outgoing=to_server, incoming=to_client)
        self.server = _Endpoint(self, outgoing=to_client, incoming=to_server)
        self.lost: set[int] = set()

    def endpoint_made(self, endpoint: _Endpoint) -> None:
        if endpoint is self.client:  # hold the client's bytes until there is somewhere to send them
            endpoint.transport.pause_reading()
            self.link.loop.create_task(self.link.connect_upstream(self))

    def endpoint_lost(self, endpoint: _Endpoint) -> None:
        self.lost.add(id(endpoint))
        if len(self.lost) == 2 or (endpoint is self.client and self.server.transport is None):
            self.link.connection_closed(self)

    def abort(self) -> None:
        for endpoint in (self.client, self.server):
            endpoint.incoming.cancel()
            if endpoint.transport is not None:
                endpoint.transport.abort()


class ShapingProxy:
    """Listens on `listen`, forwards each connection to `target` through the emulated link."""

    def __init__(
        self,
        profile: LinkProfile,
        target: tuple[str, int],
        listen: tuple[str, int] = ("127.0.0.1", 0),
        client_is_edge: bool = True,
    ):
        self.profile, self.target, self.listen, self.client_is_edge = profile, target, listen, client_is_edge
        self.stats = LinkStats()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.Server | None = None
        self.connections: set[_Connection] = set()

    @property
    def address(self) -> tuple[str, int]:
        """The bound listening address (the port is chosen by the OS when `listen` asks for port 0)."""
        assert self.server is not None, "start() first"
        return self.server.sockets[0].getsockname()[:2]

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.server = await self.loop.create_server(self._accept, self.listen[0], self.listen[1], reuse_address=True)

    def _accept(self) -> _Endpoint:
        connection = _Connection(self)
        self.connections.add(connection)
        self.stats.connections_total += 1
        self.stats.connections_open += 1
        return connection.client

    async def connect_upstream(self, connection: _Connection) -> None:
        client = connection.client.transport
        try:
            await self.loop.create_connection(lambda: connection.server, self.target[0], self.target[1])
        except OSError:
            self.stats.connect_failures += 1
            client.abort()
            return
        if client.is_closing():  # the client left while we were connecting
            connection.server.transport.close()
        else:
            connection.client.outgoing.update_source()

    def connection_closed(self, connection: _Connection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.stats.connections_open -= 1

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for connection in list(self.connections):
            connection.abort()
        await asyncio.sleep(0)


class LinkThread:
    """A ShapingProxy on its own event loop in a background thread, as a context manager:

    with LinkThread(profile, target=("127.0.0.1", 5555)) as link:
        connect to link.address ...
    """

    def __init__(self, profile: LinkProfile, target: tuple[str, int], listen=("127.0.0.1", 0), client_is_edge=True):
        self.proxy = ShapingProxy(profile, target, listen, client_is_edge)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="link-proxy", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self.proxy.address

    @property
    def stats(self) -> LinkStats:
        return self.proxy.stats

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.proxy.start())
        except BaseException as error:  # reported to the starting thread
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.proxy.stop())
        self._loop.close()

    def __enter__(self) -> LinkThread:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc_info) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may already be closed
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def serve_forever(proxy: ShapingProxy, on_ready=None) -> None:
    """Run until cancelled (the CLI's SIGINT/SIGTERM)."""
    await proxy.start()
    if on_ready is not None:
        on_ready(proxy)
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.stop()
