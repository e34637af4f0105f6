"""What the cloud verifier keeps: its configuration and counters, each request's state (KV, sampling,
the target distribution of a pending correction), Opens waiting for their prefill, and the seeded
generators every random outcome is drawn from (so a retransmission or a restarted cloud re-derives
the same outcome)."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from asyncspec.cloudedge import limits
from asyncspec.cloudedge import protocol as wire
from asyncspec.models.base import DecoderState


@dataclass(frozen=True)
class CloudConfig:
    max_batch: int = 32  # blocks per batch step
    # blocks (8 rows each) stacked into one target call where the self-test's batch check proved
    # such calls bitwise equal to a call per request (checked at 2, 4, ... this many); 1: never
    max_stack: int = 8
    max_queue: int = 1024  # queued blocks before new ones get Nack("busy")
    batch_wait_s: float = 0.0  # wait up to this long for more blocks before a forward (0: form from what is queued)
    decision_cache: int = 65_536  # cached replies for duplicates and retransmissions
    decision_cache_bytes: int = limits.DEFAULT_REPLY_CACHE_BYTES  # ... and their bytes
    max_requests: int = limits.DEFAULT_MAX_REQUESTS  # open requests (KV caches) in total
    max_requests_per_peer: int = limits.DEFAULT_MAX_REQUESTS_PER_PEER
    max_requests_per_key: int = limits.DEFAULT_MAX_REQUESTS_PER_KEY  # over all of a CURVE key's connections
    kv_budget_bytes: int | None = None  # KV the open requests may reserve (None: limits.default_kv_budget)
    max_message_bytes: int = limits.DEFAULT_MAX_MESSAGE_BYTES  # larger frames are dropped by ZeroMQ
    first_k_cap: int = 4096  # largest top-K accepted in an Open
    max_block: int = 64  # candidates per block: the verification width (fp32 logits [n + 1, V] per block)
    idle_request_s: float = 900.0  # a request not heard of this long is dropped (its edge may still ping)
    # a connection silent this long is a dead edge: its requests are freed. A live edge sends at least
    # a heartbeat every 0.5 s, and after 60 s of silence it fails its own requests (EdgePolicy.give_up_s)
    peer_dead_s: float = 60.0
    poll_ms: int = 20
    drain_s: float = 0.005  # with blocks queued, frames are read this long before their batch runs


@dataclass
class CloudCounters:
    opens: int = 0
    stale_opens: int = 0
    dead_peer_dropped: int = 0  # requests freed because their connection went silent (peer_dead_s)
    rewinds: int = 0  # resynchronisations served by cropping the KV it already had
    closes: int = 0
    blocks: int = 0
    answered_from_cache: int = 0  # duplicates / retransmissions of decided blocks
    duplicate_in_queue: int = 0
    superseded: int = 0  # queued blocks replaced by a different block at the same position (runahead)
    nacks: Counter = field(default_factory=Counter)  # reason -> count
    batches: int = 0
    batched_blocks: int = 0
    largest_batch: int = 0
    batch_sizes: Counter = field(default_factory=Counter)
    positions_verified: int = 0
    accepted: int = 0
    rejections: int = 0
    corrections: Counter = field(default_factory=Counter)  # kind -> queries answered
    pings: int = 0
    idle_dropped: int = 0
    invalid_frames: int = 0  # frames that failed the protocol's field checks
    request_errors: int = 0  # requests failed by an error while serving them (the service goes on)
    foreign_requests: int = 0  # messages naming a request another connection owns (refused)
    refused_opens: int = 0  # new requests beyond the open-request limits (Nack "full")
    settled_in_verdict: int = 0  # compact-uplink rejections the cloud settled by exact recovery itself
    forward_s: float = 0.0
    wide_calls: int = 0  # target calls that stacked several blocks (batching "stacked")

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["nacks"] = dict(self.nacks)
        out["batch_sizes"] = {str(k): v for k, v in sorted(self.batch_sizes.items())}
        out["corrections"] = dict(self.corrections)
        return out


@dataclass
class PendingCorrection:
    """The target distribution at a sampled rejection, kept until the correction is settled."""

    id: wire.BlockId
    p: torch.Tensor  # float32 [V]
    order: torch.Tensor  # [V] token ids by descending p (stable): one ordered support for every K


@dataclass
class CloudRequest:
    prompt_len: int
    sampling: wire.Sampling
    first_k: int
    epoch: int
    state: DecoderState
    first_proposals: int = 0  # exact-recovery proposals a rejecting verdict carries (Open.first_proposals)
    logprobs: int = -1  # alternatives per position the verdicts carry with log-probabilities (-1: none)
    expected_root: int | None = None  # the cloud's own last token (greedy, bonus); None after an edge correction
    pending: PendingCorrection | None = None
    touched: float = field(default_factory=time.monotonic)

    @classmethod
    def opened(cls, message: wire.Open, state: DecoderState) -> CloudRequest:
        """The request an Open starts, over its prefilled state."""
        fields = (message.prompt_len, message.sampling, message.first_k, message.epoch, state)
        return cls(*fields, first_proposals=message.first_proposals, logprobs=message.logprobs)


@dataclass
class PendingOpen:
    """An accepted Open whose prefill has not run yet: prefills run when the request's first block
    is taken into a batch, or while the cloud is idle — never inside the receive loop, where a
    flood of Opens would hold up every other peer's blocks."""

    identity: bytes
    message: wire.Open
    tokens: list[int]

    @property
    def epoch(self) -> int:
        return self.message.epoch


def reply_key(block: wire.Block) -> tuple[int, int, bytes]:
    """A block's key in the reply cache: (request, position, digest of everything in the block).
    (request, position) alone answered a different block at the same position with the old verdict."""
    fields = (block.id.n, block.id.config, block.root, block.candidates, block.q, block.q_full)
    return block.id.request, block.id.base, hashlib.blake2b(repr(fields).encode(), digest_size=16).digest()


def derived_seed(*parts) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seeded(*parts) -> torch.Generator:
    return torch.Generator().manual_seed(derived_seed(*parts))
