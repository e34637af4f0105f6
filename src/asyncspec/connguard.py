"""Connection deadlines in front of any HTTP/1.1 server: a small asyncio TCP guard.

Measured on the development machine (docs/hardening.md): uvicorn 0.54's h11 path arms no timer
before a connection's first response, and `limit_concurrency` counts open sockets, so 100 idle TCP
connections gave every other client 503 for as long as they stayed open; without the limit they
stay open forever (file descriptors). hypercorn 0.18 closes idle sockets at `keep_alive_timeout`
but has no per-address cap and its `read_timeout` is per read (a trickle evades it). So the
public socket belongs to this guard, which hands the server only complete request heads:

- the request head (line and headers) must arrive within `head_timeout_s` (408, then closed), an
  idle socket included, and fit in `max_head_bytes` (431);
- the body (Content-Length or chunked) must arrive within `body_timeout_s` (408);
- at most `per_address` connections per client address (an IPv6 /64 counts as one) and `total`
  in all; beyond, 503 and closed at once, before reading anything;
- a client that stops reading its response for `write_stall_s` is dropped;
- one request per connection: the server gets `Connection: close`, so no socket idles between
  requests (a keep-alive socket would need the head deadline again; a new connection on loopback
  or a LAN costs less than a millisecond).

The server listens on a Unix socket in a private folder (mode 0700), so nothing bypasses the guard.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import Counter
from dataclasses import dataclass

from asyncspec.httpguard import error_body

CHUNK = 64 << 10
HOP_BY_HOP = (b"connection", b"keep-alive", b"proxy-connection")


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    per_address: int = 32
    total: int = 512  # well under the default 1,024 open files
    write_stall_s: float = 60.0
    max_head_bytes: int = 64 << 10
    # after answering, what the client still sends is read and dropped this long (or this much)
    # before closing: closing on unread bytes resets the connection, and the reset can destroy the
    # answer (a 413 to an oversized body) before the client reads it (RFC 9112 9.6, lingering close)
    linger_s: float = 2.0
    linger_bytes: int = 8 << 20
    max_body_bytes: int | None = None  # a larger Content-Length: 413 here, nothing forwarded


class BadRequest(Exception):
    pass


def body_framing(head: bytes) -> tuple[bytes, int | None]:
    """(the head to forward, body length or None for chunked). Refuses what h11 would read
    differently from us (both framings, several lengths, folded lines), so one request stays one."""
    lines = head[:-4].split(b"\r\n")
    if len(lines[0].split(b" ")) != 3 or not lines[0].split(b" ")[2].startswith(b"HTTP/1."):
        raise BadRequest("not an HTTP/1.x request line")
    kept, lengths, chunked = [lines[0]], set(), False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise BadRequest("a malformed header line")
        key, value = name.lower(), value.strip()
        if key == b"content-length":
            if not value.isdigit():
                raise BadRequest("a malformed Content-Length")
            lengths.add(int(value))
        elif key == b"transfer-encoding":
            if value.lower() != b"chunked" or chunked:
                raise BadRequest("only one Transfer-Encoding: chunked is understood")
            chunked = True
        if key not in HOP_BY_HOP:
            kept.append(line)
    if len(lengths) > 1 or (lengths and chunked):
        raise BadRequest("conflicting body lengths")
    kept.append(b"Connection: close")
    return b"\r\n".join(kept) + b"\r\n\r\n", None if chunked else (lengths.pop() if lengths else 0)


async def copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int | None) -> None:
    if length is not None:
        while length > 0:
            data = await reader.read(min(length, CHUNK))
            if not data:
                raise ConnectionError("the client closed mid-body")
            writer.write(data)
            length -= len(data)
            await writer.drain()
        return
    while True:  # chunked: size line, data, CRLF; a zero size, trailers, an empty line
        line = await reader.readuntil(b"\r\n")
        writer.write(line)
        try:
            size = int(line.split(b";")[0].strip(), 16)
        except ValueError:
            raise BadRequest("a malformed chunk size") from None
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                writer.write(trailer)
            writer.write(trailer)
            return await writer.drain()
        while size + 2 > 0:
            data = await reader.read(min(size + 2, CHUNK))
            if not data:
                raise ConnectionError("the client closed mid-body")
            writer.write(data)
            size -= len(data)
            await writer.drain()


class ConnectionGuard:
    """The client-facing half: `handle` is an asyncio.start_server callback."""

    def __init__(self, backend_path: str, limits: ConnectionLimits = ConnectionLimits()):
        self.backend_path = backend_path
        self.limits = limits
        self.open: Counter[str] = Counter()
        self.refused = Counter[str]()  # why connections were cut: counts for the logs and tests

    @staticmethod
    def address_key(peer) -> str:
        host = peer[0] if isinstance(peer, tuple) and peer else "unix"
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return str(host)
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is not None:
                return str(address.ipv4_mapped)
            return str(ipaddress.ip_network(f"{address}/64", strict=False))  # one host is given a /64
        return str(address)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        key = self.address_key(writer.get_extra_info("peername"))
        if self.open.total() >= self.limits.total or self.open[key] >= self.limits.per_address:
            self.refused["connections"] += 1
            await self._answer(writer, 503, "too many connections from this address")
            return writer.close()
        self.open[key] += 1
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the client went away or stalled mid-way: nothing to answer
        except asyncio.CancelledError:
            pass  # the server is stopping; Python 3.11's stream callback would log a cancelled task
        finally:
            await self._close_lingering(reader, writer)
            self.open[key] -= 1
            if not self.open[key]:
                del self.open[key]

    async def _close_lingering(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop, received = asyncio.get_running_loop(), 0
        deadline = loop.time() + self.limits.linger_s
        try:
            if writer.can_write_eof() and not writer.is_closing():
                writer.write_eof()  # our answer is complete: the client sees the end of it
            while received < self.limits.linger_bytes and (left := deadline - loop.time()) > 0:
                data = await asyncio.wait_for(reader.read(CHUNK), left)
                if not data:
                    break
                received += len(data)
        except (OSError, TimeoutError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.head_timeout_s)
        except TimeoutError:
            self.refused["head timeout"] += 1
            return await self._answer(writer, 408, f"the request head took over {self.limits.head_timeout_s:g} s")
        except asyncio.LimitOverrunError:
            return await self._answer(writer, 431, f"the request head exceeds {self.limits.max_head_bytes} bytes")
        try:
            forwarded, length = body_framing(head)
        except BadRequest as error:
            return await self._answer(writer, 400, str(error))
        cap = self.limits.max_body_bytes
        if length is not None and cap is not None and length > cap:
            self.refused["body too large"] += 1
            return await self._answer(writer, 413, f"the request body exceeds {cap} bytes")
        backend_reader, backend_writer = await asyncio.open_unix_connection(self.backend_path)
        try:
            backend_writer.write(forwarded)
            await self._exchange(reader, writer, backend_reader, backend_writer, length)
        finally:
            backend_writer.close()

    async def _exchange(self, reader, writer, backend_reader, backend_writer, length: int | None) -> None:
        """The body goes up under its deadline while the response comes down; once the body is in,
        the client's socket is only watched for a disconnect (which cancels the request upstream)."""
        pipe = ResponsePipe(backend_reader, writer, self.limits.write_stall_s)
        response = asyncio.create_task(pipe.run())
        body = asyncio.create_task(
            asyncio.wait_for(copy_body(reader, backend_writer, length), self.limits.body_timeout_s)
        )
        watch: asyncio.Task | None = None
        try:
            await asyncio.wait({body, response}, return_when=asyncio.FIRST_COMPLETED)
            if body.done() and not response.done():
                error = body.exception()
                if error is None:
                    watch = asyncio.create_task(_until_eof(reader))
                    await asyncio.wait({response, watch}, return_when=asyncio.FIRST_COMPLETED)
                elif isinstance(error, TimeoutError) and not pipe.sent:
                    self.refused["body timeout"] += 1
                    await self._answer(writer, 408, f"the request body took over {self.limits.body_timeout_s:g} s")
                elif isinstance(error, BadRequest) and not pipe.sent:
                    await self._answer(writer, 400, str(error))
                else:  # the server stopped reading the body (it answered early: a 413): its answer goes down
                    await asyncio.wait({response}, timeout=self.limits.write_stall_s)
        finally:
            for task in (body, response, watch):
                if task is not None:
                    task.cancel()
            await asyncio.gather(body, response, *([watch] if watch else []), return_exceptions=True)

    async def _answer(self, writer: asyncio.StreamWriter, status: int, message: str) -> None:
        body = error_body(message)
        reason = {
            400: "Bad Request",
            408: "Request Timeout",
            413: "Content Too Large",
            431: "Request Header Fields Too Large",
        }
        head = (
            f"HTTP/1.1 {status} {reason.get(status, 'Service Unavailable')}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode() + body)
            await asyncio.wait_for(writer.drain(), 1.0)  # a client that reads nothing costs at most 1 s
        except (ConnectionError, TimeoutError):
            pass


class ResponsePipe:
    def __init__(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, stall_s: float):
        self.source, self.sink, self.stall_s = source, sink, stall_s
        self.sent = 0

    async def run(self) -> None:
        while data := await self.source.read(CHUNK):
            self.sink.write(data)
            self.sent += len(data)
            await asyncio.wait_for(self.sink.drain(), self.stall_s)


async def _until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(CHUNK):  # bytes after the request are dropped: the server sees one request
        pass
