"""A verifier replica that Ray restarted between two steps (no step failed) is a death: the front
counts it and routes the step's frames again, and the new process takes none of the frames meant
for its predecessor. Without Ray: the front's bookkeeping and the replica's check, directly."""

from __future__ import annotations

from types import SimpleNamespace

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.replica import Outbox, Replica
from asyncspec.cloudedge.replicas import ReplicaFront

OLD, NEW = "100-aaaa", "200-bbbb"


class RecordingChannel:
    def __init__(self) -> None:
        self.sent: list[tuple[wire.Message, bytes | None]] = []

    def send(self, message: wire.Message, identity: bytes | None = None) -> int:
        self.sent.append((message, identity))
        return 0

    def send_frame(self, frame: bytes, message: wire.Message, identity: bytes | None = None) -> int:
        return self.send(message, identity)


def _open(request: int) -> wire.Open:
    return wire.Open(request, wire.pack_ids([1, 2, 3]), 3, 0.0, 0, 0, 0)


def _block(request: int) -> wire.Block:
    return wire.Block(wire.BlockId(request, 4, 1, 0), 3, wire.pack_ids([5]), b"")


def _front_with_a_held_request() -> tuple[ReplicaFront, RecordingChannel]:
    """Two replicas; request 1 opened on replica 0 (incarnation OLD), its next block and a new
    request's Open sent to replica 0 in the step now returning."""
    front = ReplicaFront([object(), object()], {"free_kv": 10, "vocab_size": 50, "max_length": 64})
    front.channel = channel = RecordingChannel()
    first, second = front.links
    first.free_kv, second.free_kv = 10, 5
    front.route(b"edge", _open(1))
    assert front.routes[1] is first
    first.inbox, first.incarnation = [], OLD
    first.sent = [(b"edge", _block(1), None), (b"edge", _open(2), None)]
    front.routes[2] = first  # routed with the block, as `route` does for an Open
    return front, channel


def _refused(incarnation: str) -> dict:
    return {"restarted": True, "incarnation": incarnation, "replies": [], "free_kv": 10, "held": set(), "busy": False}


def test_a_replica_restarted_between_steps_is_a_counted_death_and_its_frames_are_routed_again():
    front, channel = _front_with_a_held_request()
    first, second = front.links
    front._stepped(first, _refused(NEW))
    counters = front.counters
    assert counters.replica_deaths == 1 and counters.orphaned_requests == 2, counters
    # the new request's Open went to the other replica; the held request's block is answered
    # Nack("unknown"), so its edge replays it exactly on a live replica
    assert counters.rerouted_opens == 1 and counters.resync_nacks == 1 and counters.dropped_frames == 0
    assert front.routes == {2: second} and [m.request for m, _ in channel.sent if isinstance(m, wire.Nack)] == [1]
    assert first.incarnation == NEW and not first.alive and first.sent == []
    # its next step is accepted (it names the new process) and makes it live again
    front._stepped(first, _refused(NEW) | {"restarted": False})
    assert first.alive and counters.replica_deaths == 1


def test_control_a_restart_taken_for_a_plain_step_loses_the_requests_uncounted():
    """The defect the check fixes: read as a normal step, the restarted replica's empty `held`
    silently unroutes request 1 (no death, no orphan, no resync counted) and the new request's
    Open is taken as handled by a process that never saw it."""
    front, channel = _front_with_a_held_request()
    first, _ = front.links
    front._stepped(first, _refused(NEW) | {"restarted": False})
    counters = front.counters
    assert counters.replica_deaths == 0 and counters.orphaned_requests == 0 and counters.resync_nacks == 0
    assert 1 not in front.routes and channel.sent == []


def _replica() -> tuple[Replica, list]:
    handled: list = []
    cloud = SimpleNamespace(
        handle=lambda identity, message, key: handled.append(message),
        work=lambda: None,
        quota=SimpleNamespace(kv_budget=100, kv_reserved=40),
        requests={},
        opening={},
        queue=[],
    )
    replica = Replica.__new__(Replica)
    replica.cloud, replica.outbox, replica.incarnation = cloud, Outbox(), NEW
    return replica, handled


def test_a_restarted_replica_takes_none_of_its_predecessors_frames():
    replica, handled = _replica()
    refused = replica.step([(b"edge", _block(1), None)], expected=OLD)
    assert refused["restarted"] and refused["incarnation"] == NEW and handled == []
    accepted = replica.step([(b"edge", _block(1), None)], expected=NEW)
    assert not accepted.get("restarted") and handled == [_block(1)] and accepted["free_kv"] == 60
    replica.step([(b"edge", _open(3), None)])  # the front's first step: it knows no incarnation yet
    assert handled[-1] == _open(3)
