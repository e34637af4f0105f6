"""`asyncspec bench cloud`: the cloud verifier alone under load, from real recorded edge traffic.

On two cores an edge's drafter and the cloud share the machine, so `bench cloudedge` cannot show
what the cloud itself sustains. This replays the blocks a real run sent (their candidates and q,
`serve cloud --record-traffic`, e.g. through `bench cloudedge --record-traffic`) against a real
`serve cloud` over its ZeroMQ front, from `--concurrency` sessions at once (each its own DEALER,
as edges are), each sending its next block as soon as the last verdict came: nothing is drafted,
so the cloud is what is measured (`--replicas 1,2`: a `serve cloud --replicas N` per count, N
verifier replicas on Ray behind one front). Every reply is checked against the recorded one (a mismatch
fails the command). Per variant (a `serve cloud` with its own extra arguments, e.g. batching on
or off): verified tokens per second (accepted candidates + 1 per verdict), p50/p99 verdict
latency, and the cloud's busy share (its forward seconds over the replay's wall)."""

from __future__ import annotations

import json
import re
import shlex
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zmq

from asyncspec.benchmarks.cloudedge_driver import free_port, spawn_service, stop_service
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.traffic_log import Step, load_recording, sessions_of
from asyncspec.errors import InputError

COUNTERS = re.compile(r"asyncspec cloud stopped; counters: (\{.*\})")


@dataclass
class Replay:
    variant: str
    sessions: int = 0
    verdicts: int = 0
    verified_tokens: int = 0
    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    busy_s: float | None = None

    def summary(self) -> dict:
        latencies = sorted(self.latencies_s)
        figures = {k: v for k, v in asdict(self).items() if k != "latencies_s"}
        return figures | {
            "verified_tokens_per_s": round(self.verified_tokens / self.wall_s, 2) if self.wall_s else 0.0,
            "p50_latency_ms": round(1000 * statistics.median(latencies), 2) if latencies else None,
            "p99_latency_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2) if latencies else None,
            "busy_share": round(self.busy_s / self.wall_s, 3) if self.busy_s is not None and self.wall_s else None,
        }


class Session:
    """One recorded request replayed step by step on one socket."""

    def __init__(self, steps: list[Step], socket: zmq.Socket):
        self.steps, self.socket, self.index, self.sent_at = steps, socket, 0, 0.0

    def send_next(self) -> bool:
        """Send steps until one awaits a reply; False once the session is over."""
        while self.index < len(self.steps):
            self.socket.send(wire.encode(self.steps[self.index].message))
            self.sent_at = time.perf_counter()
            if self.steps[self.index].reply is not None:
                return True
            self.index += 1
        return False

    def take_reply(self, reply: wire.Message, replay: Replay) -> None:
        expected = self.steps[self.index].reply
        replay.latencies_s.append(time.perf_counter() - self.sent_at)
        if isinstance(reply, wire.Verdict):
            replay.verdicts += 1
            replay.verified_tokens += reply.accepted + 1
        if reply != expected:
            request = wire.request_of(self.steps[0].message)
            replay.mismatches.append(f"request {request}: got {reply}, recorded {expected}")
        self.index += 1


def replay(address: str, sessions: list[list[Step]], concurrency: int, variant: str, timeout_s: float) -> Replay:
    """Replay every session, `concurrency` at a time, each on its own DEALER socket."""
    context: zmq.Context = zmq.Context.instance()
    result = Replay(variant, len(sessions))
    sockets = [context.socket(zmq.DEALER) for _ in range(max(1, concurrency))]
    for socket in sockets:
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(address)
    pending = list(reversed(sessions))
    active: dict[zmq.Socket, Session] = {}
    poller = zmq.Poller()
    for socket in sockets:
        poller.register(socket, zmq.POLLIN)
    started = time.perf_counter()
    deadline = started + timeout_s
    try:
        _start_sessions(sockets, pending, active)
        while active and time.perf_counter() < deadline:
            for socket, _ in poller.poll(100):
                message = wire.decode(socket.recv())
                if isinstance(message, wire.Pong):
                    continue
                active[socket].take_reply(message, result)
                if not active[socket].send_next():
                    del active[socket]
                    _start_sessions([socket], pending, active)
        if active or pending:
            result.mismatches.append(f"{len(active) + len(pending)} sessions unfinished after {timeout_s:.0f} s")
    finally:
        result.wall_s = time.perf_counter() - started
        for socket in sockets:
            socket.close(linger=0)
    return result


def _start_sessions(sockets, pending: list, active: dict) -> None:
    for socket in sockets:
        while pending and socket not in active:
            session = Session(pending.pop(), socket)
            if session.send_next():
                active[socket] = session


def measure_variant(args, name: str, extra: list[str], sessions: list[list[Step]], scratch: Path) -> Replay:
    """A fresh `serve cloud` with `extra` arguments, the replay against it, its busy seconds."""
    port = free_port()
    log = scratch / f"cloud-{name}.log"
    command = ["serve", "cloud", "--model", args.model, "--dtype", args.dtype, "--threads", "1", *extra]
    cloud = spawn_service([*command, "--bind", f"tcp://127.0.0.1:{port}"], log)
    try:
        result = replay(f"tcp://127.0.0.1:{port}", sessions, args.concurrency, name, args.timeout)
    finally:
        stop_service(cloud)
    found = COUNTERS.search(log.read_text())
    cloud = json.loads(found.group(1))["cloud"] if found else None
    # with replicas: their forward seconds summed, over their number (the busy share is per replica)
    result.busy_s = cloud["forward_s"] / cloud.get("replicas", 1) if cloud else None
    return result


def parse_variants(values: list[str] | None, replicas: str | None = None) -> dict[str, list[str]]:
    """NAME -> extra `serve cloud` arguments; `replicas` ("1,2"): a variant per replica count, each
    replica on Ray with one thread (`--replicas N --replica-threads 1`)."""
    variants = {}
    for count in (replicas or "").split(","):
        if not count.strip():
            continue
        if not count.strip().isdigit() or int(count) < 1:
            raise InputError(f"--replicas must be comma-separated positive counts, not {replicas!r}")
        variants[f"replicas-{int(count)}"] = ["--replicas", str(int(count)), "--replica-threads", "1"]
    for value in values or ([] if variants else ["as-is="]):
        name, _, extra = value.partition("=")
        if not name:
            raise InputError(f"--variant {value!r}: give NAME=ARGS")
        variants[name] = shlex.split(extra)
    return variants


def run(args) -> int:
    path = Path(args.traffic)
    if not path.is_file():
        raise InputError(f"{path}: no such traffic recording")
    found = sessions_of(load_recording(path))
    if not found.sessions:
        raise InputError(f"{path}: no replayable request (left out: {found.left_out})")
    print(f"{len(found.sessions)} sessions to replay; left out: {found.left_out or 'none'}")
    results = []
    with tempfile.TemporaryDirectory(prefix="asyncspec-bench-cloud-") as scratch:
        for name, extra in parse_variants(args.variant, args.replicas).items():
            result = measure_variant(args, name, extra, found.sessions, Path(scratch))
            results.append(result.summary())
            print(_line(results[-1]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"traffic": str(path), "concurrency": args.concurrency, "left_out": found.left_out, "variants": results}
    json_path = Path(args.json) if args.json else out / "bench_cloud.json"
    json_path.write_text(json.dumps(report, indent=1))
    print(f"wrote {json_path}")
    failed = [r for r in results if r["mismatches"]]
    for r in failed:
        print(
            f"asyncspec: {r['variant']}: {len(r['mismatches'])} replies differ from the recording: {r['mismatches'][0]}"
        )
    return 1 if failed else 0


def _line(r: dict) -> str:
    busy = f"{r['busy_share']:.0%}" if r["busy_share"] is not None else "?"
    return (
        f"{r['variant']:>14}: {r['verified_tokens_per_s']:8.1f} verified tok/s, p50 {r['p50_latency_ms']} ms, "
        f"p99 {r['p99_latency_ms']} ms, cloud busy {busy}, {r['verdicts']} verdicts, {len(r['mismatches'])} differ"
    )
