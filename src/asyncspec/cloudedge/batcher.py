"""The cloud's queue of blocks waiting for verification, and how a batch step is formed from it.

Blocks of every request go into one FIFO queue however they arrived. A duplicate of a queued block
is answered once (to the newest socket it came from); a different block at a queued block's
position replaces it (a runahead edge discarded the queued one); a full queue answers "busy". A
batch takes up to `max_batch` blocks, never two of one request (the later waits for the next
step), and only blocks the verifier says it can serve now.

The batch then goes through the target in one of two ways (`Batching`): "stacked", every block
of the step in wide calls of up to `most_blocks` blocks of 8 rows, where the invariance
self-test's batch check found such calls bitwise equal to a call per request on this machine,
dtype and thread count; else "per-request", one call (or more, for a long block) per request."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.models.base import DecoderState
from asyncspec.models.call_stacks import cut_into_stacks
from asyncspec.models.kv_backend import KVBackend
from asyncspec.models.selftest import InvarianceReport, stack_list

Admission = str  # "queued", "duplicate", "superseded" or "busy"
STACKED, PER_REQUEST = "stacked", "per-request"


@dataclass(frozen=True)
class Batching:
    mode: str  # STACKED or PER_REQUEST
    most_blocks: int  # blocks one call may stack (1: per request)
    why: str

    @classmethod
    def chosen(cls, report: InvarianceReport, max_stack: int, threads: int) -> Batching:
        """Stacked only where the target's batch check proved calls of that many blocks."""
        if max_stack < 2:
            return cls(PER_REQUEST, 1, f"stacking off (max_stack {max_stack})")
        proven = min(report.stacking(threads), max_stack)
        if proven >= 2:
            wider = "" if report.stacked_equal else f"; wider calls differ ({report.stacked_difference})"
            return cls(
                STACKED,
                proven,
                f"self-test batch check passed: calls of {stack_list(proven)} blocks equal per-request calls{wider}",
            )
        if not report.stacked_equal:
            return cls(PER_REQUEST, 1, f"self-test batch check FAILED: {report.stacked_difference or report.summary()}")
        return cls(PER_REQUEST, 1, f"batch check ran at {report.threads} thread(s), this cloud runs {threads}")

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return f"batching {self.mode}: {self.why}"

    def extend(
        self, target: KVBackend, states: Sequence[DecoderState], inputs: Sequence[Sequence[int]]
    ) -> tuple[list[torch.Tensor], int]:
        """Each state extended by its input: (the logits of each, the wide calls it took)."""
        if self.mode != STACKED:
            return [target.extend(state, tokens) for state, tokens in zip(states, inputs, strict=True)], 0
        width = target.call_width or 1
        blocks = sum(-(-len(tokens) // width) for tokens in inputs)
        wide = sum(1 for count in cut_into_stacks(blocks, self.most_blocks) if count > 1)
        return target.extend_stacked(states, inputs, self.most_blocks), wide


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
