"""ZeroMQ sockets with byte accounting: every message is counted per direction and type, and a
frame that does not decode is dropped and counted, never raised into the service loop."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import zmq

from asyncspec.cloudedge.protocol import Message, ProtocolError, decode, encode, peek_code, request_of
from asyncspec.cloudedge.traffic_log import TrafficRecording

HIGH_WATER_MARK = 10_000  # queued frames per socket before ZeroMQ applies back-pressure
MAX_COUNTED_PEERS = 4096  # identities with a frame count of their own (the counters stay bounded)
OTHER_PEERS = b"(other peers)"


@dataclass
class TrafficCounters:
    sent_bytes: Counter = field(default_factory=Counter)  # message type -> payload bytes
    received_bytes: Counter = field(default_factory=Counter)
    sent_messages: Counter = field(default_factory=Counter)
    received_messages: Counter = field(default_factory=Counter)
    malformed: int = 0  # frames dropped because they did not decode
    oversized: int = 0  # ... of them, frames over their message type's byte cap (never decoded)
    # ... of them, frames the decoder raised on instead of refusing (a ProtocolError): a decoder
    # defect, which costs only its frame, but which the adversarial suite requires to stay 0
    decoder_errors: int = 0
    # frames received per peer identity (ROUTER sockets; decoded or dropped), so a test can account
    # for one peer's frames exactly; at most MAX_COUNTED_PEERS identities, the rest under OTHER_PEERS
    per_peer_received: Counter = field(default_factory=Counter)
    per_request_sent: Counter = field(default_factory=Counter)  # request id -> bytes
    per_request_received: Counter = field(default_factory=Counter)
    recording: TrafficRecording | None = None  # every frame sent and decoded, when asked to record

    def as_dict(self) -> dict:
        return {
            "sent_bytes": dict(self.sent_bytes),
            "received_bytes": dict(self.received_bytes),
            "sent_messages": dict(self.sent_messages),
            "received_messages": dict(self.received_messages),
            "malformed": self.malformed,
            "oversized": self.oversized,
            "decoder_errors": self.decoder_errors,
            "sent_total": sum(self.sent_bytes.values()),
            "received_total": sum(self.received_bytes.values()),
        }

    def count_peer(self, identity: bytes | None) -> None:
        if identity is None:
            return
        known = identity in self.per_peer_received or len(self.per_peer_received) < MAX_COUNTED_PEERS
        self.per_peer_received[identity if known else OTHER_PEERS] += 1

    def forget(self, request: int) -> None:
        self.per_request_sent.pop(request, None)
        self.per_request_received.pop(request, None)


def make_socket(
    context: zmq.Context,
    kind: int,
    address: str,
    bind: bool,
    max_message_bytes: int | None = None,
    curve=None,
    routing_id: bytes | None = None,
) -> zmq.Socket:
    """A socket with bounded queues; `max_message_bytes` makes ZeroMQ drop a peer that sends a larger
    frame (never buffered); `curve` (auth.CurveKeys) turns on CURVE, as server when binding."""
    from asyncspec.cloudedge.auth import apply_curve

    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    socket.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
    if max_message_bytes is not None:
        socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if routing_id is not None:
        socket.setsockopt(zmq.ROUTING_ID, routing_id)
    if kind == zmq.ROUTER:
        socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting edge (same routing id) takes its requests along
    apply_curve(socket, curve, server=bind)
    if bind:
        socket.bind(address)
    else:
        socket.connect(address)
    return socket


Rejected = Callable[[bytes | None, ProtocolError], None]


class Channel:
    """A socket plus counters. ROUTER sockets address peers by identity; DEALERs pass None.
    `on_rejected(identity, error)` hears of every frame that failed its checks (to answer it)."""

    def __init__(
        self,
        socket: zmq.Socket,
        counters: TrafficCounters | None = None,
        on_rejected: Rejected | None = None,
        tracked: Callable[[int, Message], bool] | None = None,
        frame_caps: dict[int, int] | None = None,
        user_ids: bool = False,
    ) -> None:
        self.socket = socket
        self.user_ids = user_ids  # a ZAP authenticator runs: frames carry the sender's client key
        self.router = socket.type == zmq.ROUTER
        self.counters = counters or TrafficCounters()
        self.on_rejected = on_rejected
        # which requests get per-request byte counters (None: all); the cloud counts only requests
        # that opened, so Nacks to ids nobody opened leave no counter behind
        self.tracked = tracked
        # message code -> largest frame of that type the receiver can use, checked before decoding
        self.frame_caps = frame_caps or {}

    def send(self, message: Message, identity: bytes | None = None) -> int:
        return self.send_frame(encode(message), message, identity)

    def send_frame(self, frame: bytes, message: Message, identity: bytes | None = None) -> int:
        """Send an already encoded message (the cloud re-sends cached decisions byte for byte)."""
        name = type(message).__name__
        try:
            if self.router:
                self.socket.send_multipart([identity, frame], flags=zmq.NOBLOCK)
            else:
                self.socket.send(frame, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.counters.sent_messages["dropped_full_queue"] += 1
            return 0
        self.counters.sent_bytes[name] += len(frame)
        self.counters.sent_messages[name] += 1
        if self.counters.recording is not None:
            self.counters.recording.add("out", time.monotonic(), frame)
        request = request_of(message)
        if request is not None and (self.tracked is None or self.tracked(request, message)):
            self.counters.per_request_sent[request] += len(frame)
        return len(frame)

    def receive(self) -> tuple[bytes | None, Message] | None:
        """One waiting message (non-blocking caller: poll first); None for a dropped bad frame."""
        received = self._receive(self.socket.recv_multipart())
        return None if received is None else received[:2]

    def receive_authenticated(self) -> tuple[bytes | None, Message, bytes | None] | None:
        """As receive, with the client key the ZAP authenticator admitted the sender under (its
        User-Id: the z85 public key), or None where no authenticator runs."""
        if not self.user_ids:
            received = self.receive()
            return None if received is None else (*received, None)
        frames = self.socket.recv_multipart(copy=False)
        try:
            user = str(frames[-1].get("User-Id")).encode() or None
        except zmq.ZMQError:  # no authenticator on this socket: the frame carries no User-Id
            user = None
        received = self._receive([frame.bytes for frame in frames])
        return None if received is None else (*received, user)

    def _receive(self, parts: list[bytes]) -> tuple[bytes | None, Message] | None:
        identity = parts[0] if self.router else None
        self.counters.count_peer(identity)
        if len(parts) != (2 if self.router else 1):
            self.counters.malformed += 1
            return None
        cap = self.frame_caps.get(peek_code(parts[-1]))
        if cap is not None and len(parts[-1]) > cap:
            self.counters.malformed += 1
            self.counters.oversized += 1
            return None
        try:
            message = decode(parts[-1])
        except ProtocolError as error:
            self.counters.malformed += 1
            if self.on_rejected is not None:
                self.on_rejected(identity, error)
            return None
        except Exception:  # a decoder defect must cost one frame, never the service (fuzzing found one)
            self.counters.malformed += 1
            self.counters.decoder_errors += 1
            return None
        name = type(message).__name__
        if self.counters.recording is not None:
            self.counters.recording.add("in", time.monotonic(), parts[-1])
        self.counters.received_bytes[name] += len(parts[-1])
        self.counters.received_messages[name] += 1
        request = request_of(message)
        if request is not None and (self.tracked is None or self.tracked(request, message)):
            self.counters.per_request_received[request] += len(parts[-1])
        return identity, message

    def close(self) -> None:
        self.socket.close(linger=0)


@contextmanager
def serving_channel(
    address: str,
    curve,
    max_message_bytes: int,
    counters: TrafficCounters,
    on_rejected: Rejected,
    tracked: Callable[[int, Message], bool] | None,
    frame_caps: dict[int, int],
) -> Iterator[Channel]:
    """A service's bound ROUTER Channel (CURVE with `curve`, an auth.CurveKeys; its allow-list checked
    by a ZAP authenticator), closed with the authenticator on exit."""
    from asyncspec.cloudedge.auth import start_authenticator

    # an authenticator is one per context: a service that checks client keys gets a context of its own
    context = zmq.Context() if curve is not None and curve.authorized_dir else zmq.Context.instance()
    authenticator = start_authenticator(context, curve)
    socket = make_socket(context, zmq.ROUTER, address, True, max_message_bytes, curve)
    keyed = authenticator is not None  # each frame names the client key it was admitted under
    channel = Channel(socket, counters, on_rejected, tracked, frame_caps, keyed)
    try:
        yield channel
    finally:
        channel.close()
        if authenticator is not None:
            authenticator.stop()
            context.term()
