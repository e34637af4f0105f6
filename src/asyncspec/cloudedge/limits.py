"""Resource bounds of the cloud verifier: the reply cache capped in bytes (a "full" correction is
4·|V| bytes, 600 KB for Qwen: a cache bounded by count alone could hold tens of GB), and open
requests per peer, in total, and by the bytes of KV cache they reserve (a fixed-shape cache is
~235 MB per Qwen 1.5B request: 1,024 requests by count alone would be ~240 GB)."""

from __future__ import annotations

import os
import time
from collections import Counter, OrderedDict
from typing import Any

DEFAULT_MAX_MESSAGE_BYTES = 32 << 20  # one frame; a full-distribution uplink block for Qwen is ~4 MB
DEFAULT_REPLY_CACHE_BYTES = 64 << 20
DEFAULT_MAX_REQUESTS = 1024  # open requests in total (KV caches held)
DEFAULT_MAX_REQUESTS_PER_PEER = 512
# per authenticated CURVE key, over all of its connections: a tenant that opens new connections
# gets no new allowance (half the total, so one key cannot take the whole cloud by default)
DEFAULT_MAX_REQUESTS_PER_KEY = 512
DEFAULT_KV_SHARE = 0.5  # of the memory the KV lives in (RAM, or the GPU's), when no budget is given


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


def cloud_frame_caps(max_length: int, vocab_size: int, max_block: int) -> dict[int, int]:
    """The largest frame of each type the cloud can use, checked before decoding: an Open carries at
    most `max_length` token ids (5 bytes each at most), a Block `max_block` candidates with their q
    and (full-distribution uplink) q_full; the others are a few numbers. Blocks also stay under
    --max-message-bytes, which ZeroMQ enforces before the frame is even read."""
    from asyncspec.cloudedge import protocol as wire

    small = 1024  # ids, positions, a digest, a kind: well under a kilobyte
    caps = {code: small for code in wire.MESSAGES}
    caps[wire.Open.code] = small + 5 * max_length
    caps[wire.Block.code] = small + max_block * (5 + 4 + 4 * vocab_size)
    return caps


def request_kv_bytes(target) -> int:
    """The bytes of KV one request reserves: a fixed-shape cache knows its size (it is allocated
    whole, for every position); any other cache is sized from the model's shape at full length."""
    cache = target.empty_state().cache if hasattr(target, "empty_state") else None
    if callable(getattr(cache, "nbytes", None)):
        return int(cache.nbytes())
    if not hasattr(target, "model"):  # a model-free decoder (a test's table): nothing to reserve
        return 0
    config = target.model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * target.max_length * 4  # keys and values, fp32


def kv_device(target):
    cache = target.empty_state().cache if hasattr(target, "empty_state") else None
    keys = getattr(cache, "keys", None)
    if isinstance(keys, list) and keys:
        return keys[0].device
    return next(target.model.parameters()).device if hasattr(target, "model") else None


def default_kv_budget(device) -> int:
    """DEFAULT_KV_SHARE of the memory the KV lives in: the GPU's, or the machine's RAM."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(DEFAULT_KV_SHARE * torch.cuda.get_device_properties(device).total_memory)
    return int(DEFAULT_KV_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def quota_for(target, config) -> RequestQuota:
    """The cloud's quota for `target` under a CloudConfig: its `kv_budget_bytes` of KV (None:
    default_kv_budget), its caps in total, per connection and per client key."""
    from asyncspec.errors import InputError

    per_request = request_kv_bytes(target)
    budget = default_kv_budget(kv_device(target)) if config.kv_budget_bytes is None else config.kv_budget_bytes
    if budget < per_request:
        raise InputError(f"the KV budget ({_mib(budget)}) is below one request's KV ({_mib(per_request)})")
    return RequestQuota(
        config.max_requests, config.max_requests_per_peer, budget, per_request, config.max_requests_per_key
    )


class RequestQuota:
    """Who owns which open request, and whether a peer may open one more: by count (in total, per
    connection, and per authenticated key over all its connections) and by the KV bytes the open
    requests reserve (`kv_budget` over `kv_per_request`). A peer without a key (no authenticator)
    is bounded per connection and in total only."""

    def __init__(
        self,
        max_total: int,
        max_per_peer: int,
        kv_budget: int | None = None,
        kv_per_request: int = 0,
        max_per_key: int = DEFAULT_MAX_REQUESTS_PER_KEY,
    ):
        self.max_total, self.max_per_peer, self.max_per_key = max_total, max_per_peer, max_per_key
        self.kv_budget, self.kv_per_request = kv_budget, kv_per_request
        self.owner: dict[int, bytes] = {}
        self.key_of: dict[int, bytes] = {}  # request -> the authenticated key that opened it
        self.per_peer: Counter = Counter()
        self.per_key: Counter = Counter()

    @property
    def kv_reserved(self) -> int:
        return len(self.owner) * self.kv_per_request

    def refusal(self, peer: bytes, request: int, key: bytes | None = None) -> str | None:
        """Why `peer` (authenticated as `key`, if any) may not open `request` (None: it may)."""
        owner = self.owner.get(request)
        if owner is not None:
            return None if owner == peer else "the request id belongs to another connection"
        if len(self.owner) >= self.max_total:
            return f"the cloud holds its limit of {self.max_total} open requests"
        if self.kv_budget is not None and self.kv_reserved + self.kv_per_request > self.kv_budget:
            return (
                f"the cloud's KV memory budget is full: {len(self.owner)} open requests reserve "
                f"{_mib(self.kv_reserved)} of {_mib(self.kv_budget)}, and one more needs {_mib(self.kv_per_request)}"
            )
        if self.per_peer[peer] >= self.max_per_peer:
            return f"this connection holds its limit of {self.max_per_peer} open requests"
        if key is not None and self.per_key[key] >= self.max_per_key:
            return f"this client key holds its limit of {self.max_per_key} open requests over all its connections"
        return None

    def owns(self, peer: bytes, request: int) -> bool:
        """True unless another peer owns the request (an unknown request belongs to nobody yet)."""
        owner = self.owner.get(request)
        return owner is None or owner == peer

    def add(self, peer: bytes, request: int, key: bytes | None = None) -> None:
        if request in self.owner:
            return
        self.owner[request] = peer
        self.per_peer[peer] += 1
        if key is not None:
            self.key_of[request] = key
            self.per_key[key] += 1

    def remove(self, request: int) -> None:
        peer = self.owner.pop(request, None)
        if peer is not None:
            _decrement(self.per_peer, peer)
        key = self.key_of.pop(request, None)
        if key is not None:
            _decrement(self.per_key, key)


def _decrement(counts: Counter, item: bytes) -> None:
    counts[item] -= 1
    if counts[item] <= 0:
        del counts[item]


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


def _mib(size: int) -> str:
    return f"{size / (1 << 20):,.1f} MiB"
