"""Recorded cloud traffic: every frame a cloud received and sent (`serve cloud --record-traffic`), and
its requests as replayable sessions for `asyncspec bench cloud`.

A session is one request's uplink in order (its Open, Blocks and correction queries, then its
Close) with the reply each step got. Replayed against a cloud with the same target, every reply
must come back the same (greedy verdicts are the target's argmax; sampled ones are seeded by
the request's seed and the block's position), so a replay checks the cloud as it loads it.
Requests whose traffic is not a plain exchange (a resynchronisation, a retransmission, a Nack, a
runahead block superseded) are left out of the sessions and counted, never dropped silently."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from asyncspec.cloudedge import protocol as wire

MAX_RECORDED_FRAMES = 2_000_000  # a recording stays bounded; frames beyond it are counted, not kept


@dataclass
class TrafficRecording:
    frames: list[tuple[str, float, bytes]] = field(default_factory=list)  # (in|out, monotonic s, frame)
    not_kept: int = 0

    def add(self, direction: str, at: float, frame: bytes) -> None:
        if len(self.frames) < MAX_RECORDED_FRAMES:
            self.frames.append((direction, at, frame))
        else:
            self.not_kept += 1

    def save(self, path: Path) -> None:
        body = {"frames": [list(f) for f in self.frames], "not_kept": self.not_kept}
        path.write_bytes(msgpack.packb(body, use_bin_type=True))


def load_recording(path: Path) -> TrafficRecording:
    body = msgpack.unpackb(path.read_bytes(), raw=False)
    return TrafficRecording([(d, float(t), bytes(f)) for d, t, f in body["frames"]], int(body["not_kept"]))


@dataclass
class Step:
    message: wire.Message  # what the edge sent
    reply: wire.Message | None  # what the cloud answered (None for a Close)


@dataclass
class Sessions:
    sessions: list[list[Step]]
    left_out: dict[str, int]  # why a request's traffic was not replayable -> requests


def sessions_of(recording: TrafficRecording) -> Sessions:
    """Every request with a plain exchange, as its steps in order."""
    inbound: dict[int, list[wire.Message]] = defaultdict(list)
    outbound: dict[int, list[wire.Message]] = defaultdict(list)
    for direction, _, frame in recording.frames:
        message = wire.decode(frame)
        request = wire.request_of(message)
        if request is not None and not isinstance(message, wire.Ping | wire.Pong):
            (inbound if direction == "in" else outbound)[request].append(message)
    sessions: list[list[Step]] = []
    left_out: dict[str, int] = defaultdict(int)
    for request, sent in inbound.items():
        problem = _plain_problem(sent, outbound[request])
        if problem:
            left_out[problem] += 1
        else:
            sessions.append(_steps(sent, outbound[request]))
    return Sessions(sessions, dict(left_out))


def _plain_problem(sent: list[wire.Message], replies: list[wire.Message]) -> str | None:
    if not sent or not isinstance(sent[0], wire.Open) or sum(isinstance(m, wire.Open) for m in sent) != 1:
        return "resynchronised or never opened"
    if not isinstance(sent[-1], wire.Close):
        return "never closed"
    if any(isinstance(m, wire.Nack) for m in replies):
        return "a Nack (busy, stale, superseded or refused)"
    asked = [m for m in sent if isinstance(m, wire.Block | wire.CorrectionQuery)]
    if len(asked) != len(replies) or len({_key(m) for m in asked}) != len(asked):
        return "a retransmission or a reply missing"
    return None


def _key(message: wire.Message) -> tuple:
    if isinstance(message, wire.Block):
        return ("block", message.id.base)
    assert isinstance(message, wire.CorrectionQuery)
    return ("query", message.id.base, message.kind, message.start)


def _steps(sent: list[wire.Message], replies: list[wire.Message]) -> list[Step]:
    steps, answers = [Step(sent[0], None)], iter(replies)
    for message in sent[1:-1]:
        steps.append(Step(message, next(answers)))
    return [*steps, Step(sent[-1], None)]
