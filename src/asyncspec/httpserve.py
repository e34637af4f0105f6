"""The HTTP services' server: uvicorn on a private Unix socket, behind the connection guard
(connguard.py) on the public socket, both on one event loop. Either service (`serve edge --http`,
`listen`) builds one of these; `run()` blocks, and `should_exit` stops it, as on uvicorn.Server."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile

from asyncspec.connguard import ConnectionGuard, ConnectionLimits
from asyncspec.httpguard import uvicorn_limits


class GuardedServer:
    def __init__(self, app, listening: socket.socket, max_requests: int, limits: ConnectionLimits | None = None):
        import uvicorn

        self.listening = listening
        self.directory = tempfile.mkdtemp(prefix="asyncspec-http-")  # 0700: only this user reaches the server
        self.path = os.path.join(self.directory, "http.sock")
        self.backend = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.backend.bind(self.path)
        self.backend.listen(128)
        # uvicorn now sees only complete request heads, so its concurrency limit counts requests
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **uvicorn_limits(max_requests)))
        self.guard = ConnectionGuard(self.path, limits or ConnectionLimits())

    @property
    def should_exit(self) -> bool:
        return self.server.should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self.server.should_exit = value

    @property
    def started(self) -> bool:
        return self.server.started

    def run(self) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self.backend.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    async def _serve(self) -> None:
        front = await asyncio.start_server(
            self.guard.handle, sock=self.listening, limit=self.guard.limits.max_head_bytes
        )
        try:
            await self.server.serve(sockets=[self.backend])
        finally:
            front.close()
