"""The cloud's queue of blocks waiting for verification, and how a batch step is formed from it.

Blocks of every request go into one FIFO queue however they arrived. A duplicate of a queued block
is answered once (to the newest socket it came from); a different block at a queued block's
position replaces it (a runahead edge discarded the queued one); a full queue answers "busy". A
batch takes up to `max_batch` blocks, never two of one request (the later waits for the next
step), and only blocks the verifier says it can serve now."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from asyncspec.cloudedge import protocol as wire

Admission = str  # "queued", "duplicate", "superseded" or "busy"


class BlockQueue:
    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.blocks: deque[tuple[bytes, wire.Block]] = deque()
        self.keys: set[tuple[int, int]] = set()
        self.reply_to: dict[tuple[int, int], bytes] = {}  # newest identity a queued block came from

    def __len__(self) -> int:
        return len(self.blocks)

    def admit(self, identity: bytes, block: wire.Block) -> tuple[Admission, tuple[bytes, wire.Block] | None]:
        """Queue a block; with "superseded", the queued block it replaced (its sender gets a Nack)."""
        key = block.id.key()
        if key in self.keys:
            for index, (queued_identity, queued) in enumerate(self.blocks):
                if queued.id.key() == key and queued != block:
                    self.blocks[index] = (identity, block)
                    return "superseded", (queued_identity, queued)
            self.reply_to[key] = identity  # the edge may have reconnected: answer its newest socket
            return "duplicate", None
        if len(self.blocks) >= self.max_queue:
            return "busy", None
        self.blocks.append((identity, block))
        self.keys.add(key)
        return "queued", None

    def take(self, max_batch: int, usable: Callable[[bytes, wire.Block], bool]) -> list[tuple[bytes, wire.Block]]:
        """Up to max_batch blocks of distinct requests, oldest first; `usable` may answer a block
        itself (a cached reply, a Nack) and return False, which drops it from the queue."""
        batch: list[tuple[bytes, wire.Block]] = []
        deferred: list[tuple[bytes, wire.Block]] = []
        requests: set[int] = set()
        while self.blocks and len(batch) < max_batch:
            identity, block = self.blocks.popleft()
            self.keys.discard(block.id.key())
            identity = self.reply_to.pop(block.id.key(), identity)
            if block.id.request in requests:  # never two blocks of one request in a forward
                deferred.append((identity, block))
            elif usable(identity, block):
                batch.append((identity, block))
                requests.add(block.id.request)
        for item in reversed(deferred):
            self.blocks.appendleft(item)
            self.keys.add(item[1].id.key())
        return batch
