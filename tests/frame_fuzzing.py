"""The adversarial suite's frame fuzzing, apart from its tests: waiting on a live pair, counting
one peer's frames, what Python retains per frame, and the normal requests ("owners") that are in
flight while hostile frames name their ids."""

from __future__ import annotations

import gc
import tracemalloc

from asyncspec.cloudedge import protocol as wire
from cloudedge_support import Collector, wait_until
from hardening_support import RawPeer


def drain(peer: RawPeer) -> int:
    """Read whatever came back (Nacks, Failed, Tokens...); the count of replies."""
    count = 0
    while peer.socket.poll(0):
        peer.socket.recv_multipart()
        count += 1
    return count


def idle(live) -> bool:
    """The batch's valid requests are done (the edge admits new work again)."""
    gateway = live.gateway
    return gateway.inbox.empty() and not gateway.waiting and not gateway.requests and not live.cloud.queue


FUZZ_IDENTITY = b"fuzzing-peer"  # the hostile peer's ZeroMQ identity: its frames are counted apart
OWNER_TOKENS = 40  # a normal request long enough to be live while a batch names its id


class FrameAccount:
    """What one service did with the fuzzing peer's frames, from its own counters."""

    def __init__(self, traffic, request_errors):
        self.traffic, self.request_errors = traffic, request_errors
        self.malformed, self.decoder_errors = traffic.malformed, traffic.decoder_errors
        self.decoded = sum(traffic.received_messages.values())

    def received(self) -> int:
        return self.traffic.per_peer_received[FUZZ_IDENTITY]

    def figures(self) -> dict:
        return {
            "refused_at_decode": self.traffic.malformed - self.malformed,
            "decoder_errors": self.traffic.decoder_errors - self.decoder_errors,
            "decoded": sum(self.traffic.received_messages.values()) - self.decoded,
            "request_errors": self.request_errors(),
        }


# Frames of traceback kept per allocation: enough to see the hostile-frame generator behind an
# allocation made deep in numpy (measured: 8 frames from the generator's line to numpy's C call).
TRACE_DEPTH = 12
# The generator runs in this process; what its own calls leave in numpy's and Python's small
# caches (measured: 3.6 kB of the edge run's second half, traced to np.cumsum inside pack_ids) is
# the test's, not the services', so it is left out of what the services retain.
GENERATOR_FILES = ("*/tests/adversarial_frames.py",)
# Allocations made inside torch's, numpy's and transformers' own code, or by the engine's forward
# lines that call into it (the innermost frame only): these libraries keep small blocks of their
# own that grow with use and slow down, never per frame. Reproduced outside asyncspec: a thread
# calling torch.tensor(list) 2,000 times, six times over, left 14.0 kB then 31.6 kB of 59- and
# 73-byte blocks traced to that line. In the services they made a run's second half read as up
# to 1.38 bytes per frame (a fresh-clone CI run, 2026-12-03) where the services' own code held
# steady. The engine's state per request is tensors, which tracemalloc does not see: the RSS bound
# covers them. Every frame of the services' own code (requests, queues, caches, counters) stays in.
NUMERIC_INTERNALS = (
    "*/torch/*",
    "*/numpy/*",
    "*/transformers/*",
    "*/asyncspec/models/fixed_shape.py",
    "*/asyncspec/models/forward_causal.py",
)


def start_tracing() -> None:
    tracemalloc.start(TRACE_DEPTH)


def retained_python_bytes() -> int:
    """Bytes Python still holds for the services' own code (tracemalloc, after a collection, less
    what the frame generator allocated and what the numeric libraries keep for themselves): a leak
    of a few bytes per frame shows here, where RSS moves in pages and arenas."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    generator = [tracemalloc.Filter(False, name, all_frames=True) for name in GENERATOR_FILES]
    services = snapshot.filter_traces([*generator, *(tracemalloc.Filter(False, name) for name in NUMERIC_INTERNALS)])
    return sum(trace.size for trace in services.traces)


def steady_growth(points: list[tuple[int, int]]) -> float:
    """Bytes retained per frame once warm: the least-squares slope of (frames sent, bytes retained)
    over the second half of the run. The first half warms every path (per-position shapes,
    counters, first-time allocations: measured, its growth falls batch by batch to noise of a few
    kB); a leak keeps the same slope to the end."""
    half = points[len(points) // 2 - 1 :]
    mean_x = sum(x for x, _ in half) / len(half)
    mean_y = sum(y for _, y in half) / len(half)
    spread = sum((x - mean_x) ** 2 for x, _ in half)
    return sum((x - mean_x) * (y - mean_y) for x, y in half) / spread


def snapshot(read, attempts: int = 10) -> list[int]:
    """A copy of a dict another thread may be changing (retried while it changes)."""
    for _ in range(attempts):
        try:
            return read()
        except RuntimeError:
            continue
    return []


class CloudOwner:
    """A normal greedy request through the edge, in flight while a batch arrives at the cloud."""

    def __init__(self, live, expected: list[int]):
        self.live, self.expected = live, expected

    def start(self) -> CloudOwner:
        self.collector = Collector()
        prompt = [3, 4, 5]
        self.live.gateway.submit(prompt, OWNER_TOKENS, wire.Sampling(), 0.0, self.collector)
        assert wait_until(lambda: bool(self.ids()) or self.collector.done.is_set(), 30)
        return self

    def ids(self) -> list[int]:
        return snapshot(lambda: list(self.live.cloud.requests) + list(self.live.cloud.opening))

    def opened_by(self, identity: bytes) -> list[int]:
        return snapshot(lambda: [r for r, owner in self.live.cloud.quota.owner.items() if owner == identity])

    def problem(self) -> str | None:
        if not self.collector.done.wait(60):
            return "the in-flight request hung"
        result = self.collector.result
        if result["type"] != "done" or result["tokens"] != self.expected:
            return f"the in-flight request was disturbed: {result}"
        return None


class FrontOwner:
    """A normal client of the edge's ZeroMQ front, in flight while a batch names its tag."""

    TAG = 7

    def __init__(self, address: str, expected_text: str):
        self.peer = RawPeer(address, ROUTING_ID=b"normal-client")
        self.expected_text = expected_text

    def start(self) -> FrontOwner:
        self.peer.send_message(wire.Generate(self.TAG, "w3 w4 w5", OWNER_TOKENS, 0.0, 0, 0.0))
        return self

    def ids(self) -> list[int]:
        return [self.TAG]

    def opened_by(self, identity: bytes) -> list[int]:
        return []  # the front keeps nothing per request once it is answered

    def problem(self) -> str | None:
        replies = self.peer.replies(30, until=lambda m: isinstance(m, wire.Done | wire.Failed))
        final = replies[-1] if replies else None
        if not isinstance(final, wire.Done) or final.tag != self.TAG or final.text != self.expected_text:
            return f"the front's in-flight request was disturbed: {final}"
        return None


def owner_tokens(target) -> list[int]:
    from asyncspec.decoding.target_only import decode_target_only
    from asyncspec.models.base import DecodeRequest

    return decode_target_only(target, None, DecodeRequest((3, 4, 5), max_new_tokens=OWNER_TOKENS)).tokens


class LeakyCloud:
    """A deliberately leaky handler: it keeps 100 bytes of every frame it hears."""

    def __init__(self, cloud):
        self.cloud, self.kept, self.inner = cloud, [], cloud.handle
        cloud.handle = self

    def __call__(self, identity, message, key=None):
        self.kept.append(bytes(100))
        return self.inner(identity, message, key)
