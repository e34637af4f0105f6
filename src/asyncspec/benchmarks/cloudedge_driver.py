"""One benchmark run: the edge as a real `asyncspec serve edge` process behind a `LinkProcess` to the
cloud process, a workload driven through the edge's ZeroMQ client socket with Poisson or closed-loop
arrivals, and what each request saw at the client (send time, every committed token's arrival time,
completion) plus the statistics the edge attached to its result."""

from __future__ import annotations

import heapq
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.link.process import LinkProcess
from asyncspec.cloudedge.link.profiles import LinkProfile
from asyncspec.cloudedge.link.proxy import LinkStats
from asyncspec.cloudedge.transport import Channel, make_socket
from asyncspec.data.workloads.arrivals import Arrival, make_scheduler
from asyncspec.ports import free_port


@dataclass
class RequestRecord:
    index: int
    prompt: str
    sent: float
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    done: float | None = None
    stats: dict = field(default_factory=dict)
    error: str | None = None


@dataclass
class RunOutput:
    records: list[RequestRecord]
    started: float
    ended: float
    timed_out: bool
    link: LinkStats | None


@dataclass(frozen=True)
class Workload:
    prompts: list[str]
    requests: int
    max_new_tokens: int
    temperature: float = 0.0
    eps_req: float = 0.0
    seed: int = 0
    clients: int | None = None  # closed loop (default: all requests at once)
    rate_per_s: float | None = None  # open loop, Poisson


def spawn_service(args: list[str], log: Path, timeout_s: float = 300.0) -> subprocess.Popen:
    """`python -m asyncspec ARGS`; returns once it printed its ready line (stderr goes to `log`)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", "asyncspec", *args], stdout=subprocess.PIPE, stderr=errors, text=True, env=env
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "ready" in line:
            return process
        if not line and process.poll() is not None:
            raise RuntimeError(
                f"`asyncspec {' '.join(args[:2])}` exited {process.returncode}: {log.read_text()[-2000:]}"
            )
    process.kill()
    raise RuntimeError(f"`asyncspec {' '.join(args[:2])}` did not become ready within {timeout_s:.0f} s")


def stop_service(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    process.stdout.close()


class EdgeProcess:
    """`asyncspec serve edge` for one method, connected to a fixed link port: link processes come and go
    on that port (one per profile, so each run's wire bytes are its own) and ZeroMQ reconnects."""

    def __init__(self, edge_args: list[str], link_port: int, scratch: Path):
        self.edge_args, self.link_port, self.scratch = edge_args, link_port, scratch
        self.process: subprocess.Popen | None = None
        self.bind = ""
        self.cold = True  # no request served since the process started (the benchmark warms it up)

    def start(self) -> EdgeProcess:
        self.bind = f"tcp://127.0.0.1:{free_port()}"
        cloud = f"tcp://127.0.0.1:{self.link_port}"
        args = ["serve", "edge", *self.edge_args, "--cloud", cloud, "--bind", self.bind]
        self.process = spawn_service(args, self.scratch / "edge.log")
        self.cold = True
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_service(self.process)
            self.process = None

    def __enter__(self) -> EdgeProcess:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def run_profile(
    edge: EdgeProcess, profile: LinkProfile, cloud_port: int, workload: Workload, timeout_s: float
) -> RunOutput:
    """A link process with `profile` on the edge's link port, the workload through it. A run cut short
    leaves requests in the edge: it is restarted so that the next run starts clean."""
    with LinkProcess(profile, ("127.0.0.1", cloud_port), listen=("127.0.0.1", edge.link_port)) as link:
        time.sleep(0.3)  # the edge's socket reconnects (ZeroMQ retries every 100 ms)
        output = drive(edge.bind, workload, timeout_s)
        if output.timed_out:
            edge.stop()
    output.link = link.stats
    if edge.process is None:
        edge.start()
    return output


def drive(address: str, workload: Workload, timeout_s: float) -> RunOutput:
    """Submit the workload's requests at their arrival times; collect tokens until all finish or time runs out."""
    channel = Channel(make_socket(zmq.Context.instance(), zmq.DEALER, address, bind=False))
    scheduler = make_scheduler(
        workload.prompts, workload.rate_per_s, _clients(workload), workload.requests, workload.seed
    )
    started = time.monotonic()
    due: list[tuple[float, int, Arrival]] = []
    for arrival in scheduler.start(started):
        heapq.heappush(due, (arrival.time, arrival.index, arrival))
    records: dict[int, RequestRecord] = {}
    deadline, finished = started + timeout_s, 0
    try:
        while finished < workload.requests and time.monotonic() < deadline:
            _send_due(channel, due, records, workload)
            wait = min(deadline, due[0][0] if due else deadline) - time.monotonic()
            if channel.socket.poll(max(1, min(int(wait * 1000), 50))):
                finished += _receive(channel, records, scheduler, due)
    finally:
        channel.close()
    ended = time.monotonic()
    ordered = [records[i] for i in sorted(records)]
    return RunOutput(ordered, started, ended, finished < workload.requests, None)


def _clients(workload: Workload) -> int | None:
    if workload.rate_per_s is not None:
        return None
    return workload.clients or workload.requests


def _send_due(channel: Channel, due: list, records: dict[int, RequestRecord], workload: Workload) -> None:
    now = time.monotonic()
    while due and due[0][0] <= now:
        _, index, arrival = heapq.heappop(due)
        message = wire.Generate(
            index + 1, arrival.prompt, workload.max_new_tokens, float(workload.temperature),
            workload.seed + index, float(workload.eps_req),
        )  # fmt: skip
        records[index] = RequestRecord(index, arrival.prompt, time.monotonic())
        channel.send(message)


def _receive(channel: Channel, records: dict[int, RequestRecord], scheduler, due: list) -> int:
    """Handle every waiting message; returns how many requests finished (done or failed)."""
    finished = 0
    while channel.socket.poll(0):
        received = channel.receive()
        if received is None:
            continue
        message, now = received[1], time.monotonic()
        record = records.get(getattr(message, "tag", 0) - 1)
        if record is None:
            continue
        if isinstance(message, wire.Token):
            record.token_times.append(now)
            continue
        if isinstance(message, wire.Done):
            record.done, record.tokens, record.stats = now, wire.unpack_ids(message.tokens), message.stats
        elif isinstance(message, wire.Failed):
            record.done, record.error = now, message.message
        else:
            continue
        finished += 1
        for arrival in scheduler.completed(record.index, now):
            heapq.heappush(due, (arrival.time, arrival.index, arrival))
    return finished
