"""Resource bounds of the cloud verifier: the reply cache capped in bytes (a "full" correction is
4·|V| bytes, 600 KB for Qwen: a cache bounded by count alone could hold tens of GB), and open
requests per peer and in total (each holds a KV cache)."""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from typing import Any

DEFAULT_MAX_MESSAGE_BYTES = 32 << 20  # one frame; a full-distribution uplink block for Qwen is ~4 MB
DEFAULT_REPLY_CACHE_BYTES = 64 << 20
DEFAULT_MAX_REQUESTS = 1024  # open requests in total (KV caches held)
DEFAULT_MAX_REQUESTS_PER_PEER = 512


class ReplyCache:
    """Encoded replies by key, oldest evicted first once either the count or the byte cap is reached.
    Keys start with the request id; an index by request makes forgetting a request cost its own
    entries only (a scan of the whole cache per Close would let a peer burn the loop's time)."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries: OrderedDict[tuple, tuple[bytes, object]] = OrderedDict()
        self.by_request: dict[int, set[tuple]] = {}
        self.bytes = 0

    def __contains__(self, key: tuple) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, key: tuple) -> tuple[bytes, Any]:
        return self.entries[key]

    def put(self, key: tuple, frame: bytes, message: object) -> None:
        self.pop(key)
        self.entries[key] = (frame, message)
        self.by_request.setdefault(key[0], set()).add(key)
        self.bytes += len(frame)
        while self.entries and (len(self.entries) > self.max_entries or self.bytes > self.max_bytes):
            self.pop(next(iter(self.entries)))

    def pop(self, key: tuple) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        self.bytes -= len(entry[0])
        keys = self.by_request.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_request[key[0]]

    def forget(self, request: int) -> None:
        """Every reply of one request."""
        for key in list(self.by_request.get(request, ())):
            self.pop(key)


class RequestQuota:
    """Who owns which open request, and whether a peer may open one more."""

    def __init__(self, max_total: int, max_per_peer: int):
        self.max_total, self.max_per_peer = max_total, max_per_peer
        self.owner: dict[int, bytes] = {}
        self.per_peer: Counter = Counter()

    def refusal(self, peer: bytes, request: int) -> str | None:
        """Why `peer` may not open `request` (None: it may)."""
        owner = self.owner.get(request)
        if owner is not None:
            return None if owner == peer else "the request id belongs to another connection"
        if len(self.owner) >= self.max_total:
            return f"the cloud holds its limit of {self.max_total} open requests"
        if self.per_peer[peer] >= self.max_per_peer:
            return f"this connection holds its limit of {self.max_per_peer} open requests"
        return None

    def owns(self, peer: bytes, request: int) -> bool:
        """True unless another peer owns the request (an unknown request belongs to nobody yet)."""
        owner = self.owner.get(request)
        return owner is None or owner == peer

    def add(self, peer: bytes, request: int) -> None:
        if request not in self.owner:
            self.owner[request] = peer
            self.per_peer[peer] += 1

    def remove(self, request: int) -> None:
        peer = self.owner.pop(request, None)
        if peer is not None:
            self.per_peer[peer] -= 1
            if self.per_peer[peer] <= 0:
                del self.per_peer[peer]


class PeerLiveness:
    """When each connection last sent anything; `dead` hands over (and forgets) the silent ones.
    Entries live at most `dead_after_s` past a peer's last frame, so many short-lived ids cost little."""

    def __init__(self, dead_after_s: float):
        self.dead_after_s = dead_after_s
        self.last: dict[bytes, float] = {}

    def heard(self, peer: bytes) -> None:
        self.last[peer] = time.monotonic()

    def dead(self, now: float) -> set[bytes]:
        gone = {peer for peer, seen in self.last.items() if now - seen > self.dead_after_s}
        for peer in gone:
            del self.last[peer]
        return gone
