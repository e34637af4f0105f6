"""The cloud as a ZeroMQ front over verifier replicas on Ray (`serve cloud --replicas N`).

The front is what edges connect to, as to a single cloud: the same ROUTER socket, CURVE and its
authenticator, frame caps and field checks (transport.Channel). It verifies nothing itself. A
request's Open goes to the live replica with the most free KV bytes, and every later frame of that
request to the same replica (session-sticky: the request's KV lives there). Each replica gets one
Ray actor call at a time (`Replica.step`) carrying the frames routed to it since its last call; the
replies come back as the call's result and the front sends them. Pings are answered here.

A replica that dies (Ray raises ActorDiedError or another RayActorError on its step) loses nothing:
its routes are dropped, the frames of its lost step are routed again (an Open to another replica,
a block or query is answered Nack("unknown"), and the edge resynchronises by replaying its request
exactly on a live replica). Ray restarts the actor (`max_restarts`); it takes new requests once a
step succeeds again. A replica restarted between two steps (no step failed) is found by its
incarnation: every step names the one the front last heard from, and a new process refuses the
frames meant for its predecessor, which is then handled as a death. Every death, orphaned request
and resync is counted in the front's summary.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from asyncspec.cloudedge import limits
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.auth import CurveKeys
from asyncspec.cloudedge.replica import Routed
from asyncspec.cloudedge.transport import Channel, TrafficCounters, serving_channel


class ReplicaRestarted(RuntimeError):
    """A step reached a process Ray had started anew since the front's last step there."""


@dataclass(frozen=True)
class FrontConfig:
    max_message_bytes: int = limits.DEFAULT_MAX_MESSAGE_BYTES
    max_block: int = 64
    tick_s: float = 1.0  # an idle replica still gets a step this often (its idle drops, a restart's check)
    # after a step's verdicts go out, its next step waits up to this long for the next blocks of the
    # requests just answered, so that they are verified as one batch (the single cloud's drain_s)
    gather_s: float = 0.02
    # test switches, the negative controls: route every frame round-robin instead of by request; on a
    # replica's death, keep its routes and drop its lost frames instead of resynchronising them
    sticky: bool = True
    resync_on_death: bool = True


@dataclass
class FrontCounters:
    routed_opens: int = 0
    routed_frames: int = 0
    steps: int = 0
    pings: int = 0
    invalid_frames: int = 0
    foreign_requests: int = 0
    unrouted_frames: int = 0  # a block or query of a request no live replica holds: Nack("unknown")
    replica_deaths: int = 0
    orphaned_requests: int = 0  # requests routed to a replica when it died (each resyncs elsewhere)
    rerouted_opens: int = 0  # Opens lost in a dead replica's step, routed to another
    resync_nacks: int = 0  # Nack("unknown") for frames lost in a dead replica's step
    dropped_frames: int = 0  # frames lost with a dead replica and not resynchronised (the control only)
    retired_replicas: int = 0
    nacks: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return dict(self.__dict__) | {"nacks": dict(self.nacks)}


@dataclass
class ReplicaLink:
    """One replica as the front sees it: its actor, its frames waiting for the next step, its call in flight."""

    index: int
    actor: Any
    inbox: list[Routed] = field(default_factory=list)
    sent: list[Routed] = field(default_factory=list)  # the frames of the step in flight
    in_flight: Any = None  # the step's ObjectRef
    free_kv: int = 0
    alive: bool = True
    busy: bool = False
    awaiting: set[int] = field(default_factory=set)  # requests just answered, whose next block may come
    gather_until: float = 0.0
    retired: bool = False  # dead for good (Ray restarts it no more): takes no frames again
    last_step: float = 0.0
    incarnation: str | None = None  # the replica process the front last heard from (None: not yet)


class ReplicaFront:
    def __init__(self, actors: list[Any], info: dict, config: FrontConfig | None = None):
        self.config = config or FrontConfig()
        self.links = [ReplicaLink(i, actor, free_kv=info["free_kv"]) for i, actor in enumerate(actors)]
        self.info = info  # vocab_size, max_length of the replicas' target
        self.routes: dict[int, ReplicaLink] = {}
        self.owners: dict[int, bytes] = {}  # request -> the connection that opened it
        self.instance = random.getrandbits(31)
        self.counters = FrontCounters()
        self.traffic = TrafficCounters()
        self.channel: Channel | None = None
        self._turn = 0
        self._wake_r, self._wake_w = os.pipe()  # a finished step writes a byte: the poll wakes at once

    # ------------------------------------------------------------ service loop

    def serve(
        self,
        address: str,
        should_stop: Callable[[], bool],
        on_ready: Callable[[], None] = lambda: None,
        curve: CurveKeys | None = None,
    ) -> None:
        caps = limits.cloud_frame_caps(self.info["max_length"], self.info["vocab_size"], self.config.max_block)
        max_bytes = self.config.max_message_bytes
        try:
            with serving_channel(address, curve, max_bytes, self.traffic, self._invalid_frame, None, caps) as channel:
                self.channel = channel
                self._loop(should_stop, on_ready)
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _loop(self, should_stop: Callable[[], bool], on_ready: Callable[[], None]) -> None:
        poller = zmq.Poller()
        poller.register(self.channel.socket, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        on_ready()
        while not should_stop():
            waits = [link.gather_until for link in self.links if link.inbox and link.in_flight is None]
            timeout = max(0, min([100, *(1000 * (t - time.monotonic()) for t in waits)]))
            events = dict(poller.poll(int(timeout) + 1 if waits else 100))
            if self._wake_r in events:
                os.read(self._wake_r, 4096)
            for _ in range(10_000):
                if not self.channel.socket.poll(0, zmq.POLLIN):
                    break
                received = self.channel.receive_authenticated()
                if received is not None:
                    self.route(*received)
            self._collect()
            self._submit()

    def _submit(self) -> None:
        """A step for every replica without one in flight that has frames, work, or is due a tick."""
        now = time.monotonic()
        for link in self.links:
            if link.in_flight is not None or link.retired:
                continue
            if link.inbox and not link.busy and self._gathering(link, now):
                continue
            if link.inbox or link.busy or now - link.last_step > self.config.tick_s:
                link.sent, link.inbox, link.awaiting = link.inbox, [], set()
                link.in_flight, link.last_step = link.actor.step.remote(link.sent, link.incarnation), now
                link.in_flight.future().add_done_callback(lambda _: os.write(self._wake_w, b"."))
                self.counters.steps += 1

    def _gathering(self, link: ReplicaLink, now: float) -> bool:
        """Whether the link still waits for the next blocks of requests its last step answered."""
        arrived = {wire.request_of(message) for _, message, _ in link.inbox}
        return now < link.gather_until and not link.awaiting <= arrived

    def _collect(self) -> None:
        import ray

        for link in self.links:
            if link.in_flight is None:
                continue
            ready, _ = ray.wait([link.in_flight], timeout=0)
            if not ready:
                continue
            ref, link.in_flight = link.in_flight, None
            try:
                result = ray.get(ref)
            except ray.exceptions.ActorDiedError as error:  # dead, and Ray will not restart it
                self._died(link, error, final=True)
                continue
            except ray.exceptions.ActorUnavailableError as error:  # dead and restarting (or unreachable)
                self._died(link, error, final=False)
                continue
            except ray.exceptions.RayError as error:  # its step failed as a whole: treated as a death
                self._died(link, error, final=False)
                continue
            self._stepped(link, result)

    def _stepped(self, link: ReplicaLink, result: dict) -> None:
        link.incarnation = result["incarnation"]
        if result.get("restarted"):  # it took none of the step's frames: they are routed again
            self._died(link, ReplicaRestarted(f"replica {link.index} was restarted between two steps"), final=False)
            return
        link.alive, link.busy, link.free_kv, link.sent = True, result["busy"], result["free_kv"], []
        for identity, frame, message in result["replies"]:
            self.channel.send_frame(frame, message, identity)
            if isinstance(message, wire.Verdict):
                link.awaiting.add(message.id.request)
        link.gather_until = time.monotonic() + self.config.gather_s
        waiting = {wire.request_of(message) for _, message, _ in link.inbox}
        for request in [r for r, held_by in self.routes.items() if held_by is link]:
            if request not in result["held"] and request not in waiting:  # closed, refused or dropped there
                self._unroute(request)

    # ------------------------------------------------------------ routing

    def route(self, identity: bytes, message: wire.Message, key: bytes | None = None) -> None:
        request = wire.request_of(message)
        if isinstance(message, wire.Ping):
            self.counters.pings += 1
            self._send(identity, wire.Pong(message.sent, self.instance, *self._pong_fields()))
            return
        if request is None:  # a cloud->edge message sent to the cloud: not ours to act on
            self.counters.nacks["unexpected"] += 1
            return
        if self.owners.get(request, identity) != identity:
            self.counters.foreign_requests += 1
            self._nack(identity, request, _base(message), "invalid", "the request id belongs to another connection")
            return
        link = self._link_for(identity, request, message)
        if link is None:
            return
        self.counters.routed_frames += 1
        link.inbox.append((identity, message, key))
        self.owners.setdefault(request, identity)

    def _link_for(self, identity: bytes, request: int, message: wire.Message) -> ReplicaLink | None:
        """The replica this frame goes to (None: answered or dropped here)."""
        live = [link for link in self.links if not link.retired]
        if not live:
            self._nack(identity, request, _base(message), "invalid", "every cloud replica has died")
            return None
        if not self.config.sticky:  # the control: not by request
            self._turn += 1
            return live[self._turn % len(live)]
        link = self.routes.get(request)
        if isinstance(message, wire.Open) and link is None:
            link = max(live, key=lambda candidate: (candidate.alive, candidate.free_kv, -candidate.index))
            link.free_kv -= 1  # until its next step says otherwise: equal replicas take turns
            self.routes[request] = link
            self.counters.routed_opens += 1
        if link is None and not isinstance(message, wire.Close):
            self.counters.unrouted_frames += 1
            self._nack(identity, request, _base(message), "unknown", "no cloud replica holds this request")
        return link

    def _unroute(self, request: int) -> None:
        self.routes.pop(request, None)
        self.owners.pop(request, None)

    # ------------------------------------------------------------ a replica's death

    def _died(self, link: ReplicaLink, error: Exception, final: bool) -> None:
        """A step failed: the replica died (`final`: for good), or is restarting after a death
        counted when its first step failed (a replica is alive again once a step succeeds)."""
        if link.alive:
            self.counters.replica_deaths += 1
            orphans = [request for request, held_by in self.routes.items() if held_by is link]
            self.counters.orphaned_requests += len(orphans)
            print(
                f"asyncspec cloud: replica {link.index} died ({type(error).__name__}); {len(orphans)} requests "
                f"resync elsewhere, {len(link.sent) + len(link.inbox)} frames in flight",
                file=sys.stderr,
                flush=True,
            )
            if self.config.resync_on_death:  # (the control keeps its requests routed to it)
                for request in orphans:
                    self._unroute(request)
        if final and not link.retired:
            link.retired = True
            self.counters.retired_replicas += 1
        self._lost(link)

    def _lost(self, link: ReplicaLink) -> None:
        """The frames of a failed step (and those waiting for the next) are routed again."""
        link.alive, link.busy, link.free_kv = False, False, -1
        lost, link.sent, link.inbox = link.sent + link.inbox, [], []
        if not self.config.resync_on_death:  # the control: the frames are gone
            self.counters.dropped_frames += len(lost)
            return
        for identity, message, key in lost:
            if isinstance(message, wire.Open):
                self.counters.rerouted_opens += 1
            elif wire.request_of(message) not in self.routes and not isinstance(message, wire.Close):
                self.counters.resync_nacks += 1
            self.route(identity, message, key)

    # ------------------------------------------------------------ replies of the front's own

    def _pong_fields(self) -> tuple[int, int, int]:
        queued = sum(len(link.inbox) + len(link.sent) for link in self.links)
        return self.info["vocab_size"], self.info["max_length"], queued

    def _send(self, identity: bytes, message: wire.Message) -> None:
        self.channel.send(message, identity)

    def _nack(self, identity: bytes, request: int, base: int, reason: str, detail: str = "") -> None:
        self.counters.nacks[reason] += 1
        self._send(identity, wire.Nack(request, base, reason, detail[:500]))

    def _invalid_frame(self, identity: bytes | None, error: wire.ProtocolError) -> None:
        self.counters.invalid_frames += 1
        message = error.message
        request = wire.request_of(message) if message is not None else None
        if identity is not None and request is not None:
            self._nack(identity, request, _base(message), "invalid", str(error))

    def summary(self, replica_summaries: list[dict]) -> dict:
        forward_s = sum(s.get("cloud", {}).get("forward_s", 0.0) for s in replica_summaries)
        return {
            "front": self.counters.as_dict(),
            "replicas": replica_summaries,
            "cloud": {"forward_s": forward_s, "replicas": len(self.links)},
            "traffic": self.traffic.as_dict(),
            "open_requests": len(self.routes),
        }


def _base(message: wire.Message) -> int:
    if isinstance(message, wire.Open):
        return len(wire.unpack_ids(message.tokens)) + 1
    return message.id.base if hasattr(message, "id") else 0
