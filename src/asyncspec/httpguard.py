"""The gate in front of every HTTP service (the edge's OpenAI API, `listen`): optional API keys
(`Authorization: Bearer`, as OpenAI clients send it), each with its own cap on requests in flight
(one client's burst cannot take every place from the others), a Host allow-list (against DNS
rebinding of a service on loopback), and a cap on request body bytes, checked before any handler
runs and again while the body streams in (a client may send no Content-Length or a false one).

A plain ASGI middleware, so streaming responses pass through untouched; refusals are JSON in the
OpenAI error shape. No CORS headers are ever added: browsers on other origins get no access.
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from asyncspec.errors import InputError

DEFAULT_MAX_BODY_BYTES = 1 << 20  # JSON completion requests are a few KB
DEFAULT_MAX_HEADER_BYTES = 32 << 10  # h11's incomplete-event cap misses headers that arrive at once
API_KEY_ENV = "ASYNCSPEC_API_KEY"
MIN_KEY_CHARS = 16
# requests in flight per API key: a service's whole connection cap is 32-64, so one key (one
# client, or one leaked key) holds at most half of it
DEFAULT_MAX_REQUESTS_PER_KEY = 16
FORM_OVERHEAD_BYTES = 64 << 10  # multipart boundaries and small text fields around an uploaded file
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")


@dataclass(frozen=True)
class GuardConfig:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    api_keys: tuple[str, ...] = ()  # empty: no authentication
    allowed_hosts: tuple[str, ...] = field(default=())  # empty: any Host header
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_requests_per_key: int = DEFAULT_MAX_REQUESTS_PER_KEY


def is_loopback_host(host: str) -> bool:
    name = host.strip("[]").lower()
    return name in ("localhost", "::1") or name.startswith("127.")


def allowed_hosts_for(bind_host: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The Host names a service answers to, on every bind (a DNS-rebound name is refused): the
    loopback names, the bound address itself unless it is a wildcard (0.0.0.0, ::), and whatever
    the operator lists (`--allow-host`, e.g. the machine's name or address as clients type it)."""
    names = [*LOOPBACK_HOSTS]
    if bind_host not in WILDCARD_HOSTS:
        names.append(bind_host)
        if ":" in bind_host and not bind_host.startswith("["):  # an IPv6 literal arrives bracketed
            names.append(f"[{bind_host}]")
    names.extend(extra)
    return tuple(dict.fromkeys(name.lower() for name in names))


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


async def send_error(send, status: int, message: str, kind: str = "invalid_request_error") -> None:
    body = error_body(message, kind)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def load_api_keys(path: str | None) -> tuple[str, ...]:
    """The keys in a file (one per line, one per client; blank lines and `#` comments skipped) or
    the one in $ASYNCSPEC_API_KEY; never from the command line, where every local user could read
    it in the process list. Empty: no authentication."""
    if path is not None:
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            raise InputError(f"{path}: cannot read API keys from it") from None
        keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not keys:
            raise InputError(f"{path}: holds no API key")
    else:
        keys = [key] if (key := os.environ.get(API_KEY_ENV, "").strip()) else []
    if any(len(key) < MIN_KEY_CHARS for key in keys):
        raise InputError(f"every API key must have at least {MIN_KEY_CHARS} characters")
    return tuple(dict.fromkeys(keys))


def guard_config(
    bind_host: str,
    api_key_file: str | None,
    max_body_bytes: int,
    extra_hosts=(),
    insecure_no_auth: bool = False,
    max_requests_per_key: int = DEFAULT_MAX_REQUESTS_PER_KEY,
) -> GuardConfig:
    if max_body_bytes < 1024:
        raise InputError(f"the body cap must be at least 1024 bytes, got {max_body_bytes}")
    if max_requests_per_key < 1:
        raise InputError(f"the requests per API key must be at least 1, got {max_requests_per_key}")
    keys = load_api_keys(api_key_file)
    if not keys and not is_loopback_host(bind_host):
        require_auth_off_loopback(bind_host, insecure_no_auth)
    hosts = allowed_hosts_for(bind_host, tuple(extra_hosts))
    if bind_host in WILDCARD_HOSTS and not extra_hosts:
        note = f"bound to {bind_host or '*'}, but only loopback Host names are answered; add the names clients use"
        print(f"asyncspec: note: {note} with --allow-host NAME", file=sys.stderr, flush=True)
    return GuardConfig(max_body_bytes, keys, hosts, max_requests_per_key=max_requests_per_key)


def require_auth_off_loopback(bind_host: str, insecure_no_auth: bool) -> None:
    """Off loopback anyone who reaches the port could use the service (and its models' CPU): a key
    is required, and the only way around it is a flag that says so and is loud in the log."""
    if not insecure_no_auth:
        raise InputError(
            f"refusing to serve HTTP on {bind_host or '*'} without an API key: anyone who reaches it could use it; "
            f"pass --api-key-file FILE (or set {API_KEY_ENV}), bind to 127.0.0.1, "
            "or pass --insecure-no-auth on a network you trust"
        )
    print(
        f"asyncspec: WARNING: serving HTTP on {bind_host or '*'} WITHOUT AUTHENTICATION (--insecure-no-auth): "
        "anyone who can reach this port can use this service",
        file=sys.stderr,
        flush=True,
    )


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """Bound before the server starts, so a busy port is a clear error (exit 2), not a silent hang."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        listening = socket.socket(family, kind, proto)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
    except OSError as error:
        raise InputError(f"cannot serve HTTP on {host}:{port}: {error.strerror or error}") from None
    listening.listen(128)
    listening.set_inheritable(True)
    return listening


def uvicorn_limits(max_connections: int) -> dict:
    """Connection and timeout caps for uvicorn.Config: slow or piled-up clients cannot hold the server."""
    if max_connections < 1:
        raise InputError(f"the connection limit must be at least 1, got {max_connections}")
    return {
        "limit_concurrency": max_connections,  # beyond it: 503 at once
        "timeout_keep_alive": 5,
        "h11_max_incomplete_event_size": 64 * 1024,  # request line + headers
        "timeout_graceful_shutdown": 5,
    }


def install_error_handlers(app) -> None:
    """Framework errors (bad multipart boundary, unknown path, wrong method, query-parameter types)
    in the same OpenAI error shape as the services' own: one shape for every client."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from starlette.exceptions import HTTPException

    def reply(status: int, message: str) -> Response:
        return Response(error_body(message), status, media_type="application/json")

    @app.exception_handler(HTTPException)
    async def http_error(_, error: HTTPException) -> Response:
        return reply(error.status_code, str(error.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(_, error: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in error.errors()[:5])
        return reply(400, f"invalid request: {problems}")


class Guard:
    """ASGI middleware: host, key and body-size checks for every HTTP request."""

    def __init__(self, app, config: GuardConfig):
        self.app = app
        self.config = config
        self.in_flight: Counter[int] = Counter()  # requests being served, by API key (its index)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = scope.get("headers", [])
        if sum(len(k) + len(v) for k, v in raw) > self.config.max_header_bytes:
            return await send_error(send, 431, f"the request headers exceed {self.config.max_header_bytes} bytes")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        key = _matching_key(headers.get("authorization", ""), self.config.api_keys)
        refusal = self._refusal(headers, key)
        if refusal is not None:
            return await send_error(send, *refusal)
        if key is None:
            return await self._with_body_cap(scope, receive, send)
        if self.in_flight[key] >= self.config.max_requests_per_key:
            limit = self.config.max_requests_per_key
            message = f"this API key has {limit} requests in flight, its limit; retry when one has finished"
            return await send_error(send, 429, message, "rate_limit_error")
        self.in_flight[key] += 1
        try:
            return await self._with_body_cap(scope, receive, send)
        finally:
            self.in_flight[key] -= 1
            if not self.in_flight[key]:
                del self.in_flight[key]

    def _refusal(self, headers: dict[str, str], key: int | None) -> tuple[int, str, str] | None:
        """`key`: the index of the API key the request carries (None: none of them)."""
        config = self.config
        if config.allowed_hosts and host_name(headers.get("host", "")).lower() not in config.allowed_hosts:
            return 400, "the Host header is not one this service answers to", "invalid_request_error"
        if config.api_keys and key is None:
            return 401, "a valid API key is required (Authorization: Bearer KEY)", "authentication_error"
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > config.max_body_bytes):
            return 413, f"the request body exceeds {config.max_body_bytes} bytes", "invalid_request_error"
        return None

    async def _with_body_cap(self, scope, receive, send):
        """Reads the whole body (at most the cap) before the app sees it, then replays it: memory per
        request stays bounded by the cap, and a body that is too long never reaches a handler."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away mid-body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.config.max_body_bytes:
                return await send_error(send, 413, f"the request body exceeds {self.config.max_body_bytes} bytes")
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnect notices

        return await self.app(scope, replay, send)


def host_name(host: str) -> str:
    if host.startswith("["):  # [::1]:8000
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _matching_key(authorization: str, keys: tuple[str, ...]) -> int | None:
    """The index of the key a Bearer header carries, or None. Every key is compared, in constant
    time each, so the time taken says nothing about which key came close."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    matches = [hmac.compare_digest(given.strip().encode(), key.encode()) for key in keys]
    return matches.index(True) if any(matches) else None
