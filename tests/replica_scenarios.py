"""The replica scenarios of test_cloudedge_replicas, run as one script inside a network namespace
that has only loopback (ray_netns.run_in_loopback_netns), so that Ray cannot reach or advertise
any address off this machine. Each scenario starts a real `serve cloud --replicas 2` (an embedded
Ray, two replica actors on a tiny Qwen3 target), runs greedy requests through a real in-process
edge gateway, and reports what the requests returned and the front's exit counters as JSON.

Usage: python tests/replica_scenarios.py OUT.json"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from asyncspec.cloudedge import protocol as wire  # noqa: E402
from asyncspec.cloudedge.edge import EdgeGateway  # noqa: E402
from asyncspec.cloudedge.policy import EdgePolicy  # noqa: E402
from asyncspec.decoding.target_only import decode_target_only  # noqa: E402
from asyncspec.models.base import DecodeRequest  # noqa: E402
from cloudedge_support import (  # noqa: E402
    Collector,
    ServiceThread,
    free_address,
    free_port,
    model_pair,
    save_tiny,
    spawn,
)

PROMPTS = [[3, 17, 5, 8], [9, 2, 44], [12, 13, 14, 15, 16], [7, 7, 1]]
TOKENS = 48
# The round with the kill runs longer, so the kill lands while every request is still running: on a
# loaded machine one replica's request ran 23 of 48 tokens before the other's had a second event.
KILL_ROUND_TOKENS = 160
COUNTERS = re.compile(r"asyncspec cloud stopped; counters: (\{.*\})")
WINDOW_S = 0.1  # how far back the kill looks for the replica doing the work
PIDS = re.compile(r"pids ([\d, ]+);")


def submit(gateway: EdgeGateway, tokens: int) -> list[Collector]:
    collectors = []
    for prompt in PROMPTS:
        collector = Collector()
        gateway.submit(prompt, tokens, wire.Sampling(), 0.0, collector)
        collectors.append(collector)
    return collectors


def finished(collectors: list[Collector], timeout_s: float) -> list[dict | None]:
    """Each request's final event, or None for one that did not finish within timeout_s."""
    deadline = time.monotonic() + timeout_s
    for collector in collectors:
        collector.done.wait(max(0.0, deadline - time.monotonic()))
    return [c.result if c.done.is_set() else None for c in collectors]


def scenario(target_dir: Path, drafter, extra: list[str], kill: bool, timeout_s: float) -> dict:
    """A `serve cloud --replicas 2` with `extra` arguments: a first round of requests, then a second
    during which (if `kill`) the busier replica's process is killed with SIGKILL once every request has
    output."""
    address = free_address()
    cloud = spawn(
        "serve", "cloud", "--replicas", "2", "--model", str(target_dir), "--dtype", "fp32", "--bind", address, *extra
    )
    report: dict = {"extra": extra}
    started = time.monotonic()
    try:
        ready = _ready(cloud)
        report["ready_s"] = round(time.monotonic() - started, 1)
        pids = [int(p) for p in PIDS.search(ready).group(1).split(",")]
        report["ready"], report["pids"] = ready.strip(), pids
        gateway = EdgeGateway(drafter, address, EdgePolicy(block_size=5))
        edge = ServiceThread(gateway).start()
        try:
            report["first"] = [_tokens(r) for r in finished(submit(gateway, TOKENS), timeout_s)]
            collectors = submit(gateway, KILL_ROUND_TOKENS)
            if kill:
                killed = _kill_when_all_have_output(pids, collectors, timeout_s)
                report["killed"], report["killed_at_events"] = pids.index(killed), [len(c.events) for c in collectors]
                report["finished_before_kill"] = [c.done.is_set() for c in collectors]
            report["second"] = [_tokens(r) for r in finished(collectors, timeout_s)]
            report["edge"] = gateway.summary()
        finally:
            edge.close()
    finally:
        cloud.send_signal(signal.SIGTERM)
        _, stderr = cloud.communicate(timeout=60)
    found = COUNTERS.search(stderr)
    report["counters"] = json.loads(found.group(1)) if found else None
    report["stderr_tail"] = stderr[-3000:]
    report["scenario_s"] = round(time.monotonic() - started, 1)
    return report


def _kill_when_all_have_output(pids: list[int], collectors, timeout_s: float) -> int:
    """SIGKILL the replica busiest over the last WINDOW_S once every request has output: one that
    holds unfinished requests. Routing goes by free KV bytes as the replicas last reported them, so
    on a loaded machine all requests can land on one replica, or one replica's can finish first;
    killing the idle one would test nothing."""
    deadline = time.monotonic() + timeout_s
    samples = [(time.monotonic(), [_cpu_ticks(pid) for pid in pids])]
    while time.monotonic() < deadline and not all(len(c.events) > 1 for c in collectors):
        time.sleep(0.005)
        samples.append((time.monotonic(), [_cpu_ticks(pid) for pid in pids]))
        while len(samples) > 2 and samples[1][0] <= samples[-1][0] - WINDOW_S:
            samples.pop(0)  # keep the oldest sample that is at least WINDOW_S old
    now = [_cpu_ticks(pid) for pid in pids]
    used = [after - before for after, before in zip(now, samples[0][1], strict=True)]
    killed = pids[used.index(max(used))]
    os.kill(killed, signal.SIGKILL)
    return killed


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _ready(process) -> str:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "ready" in line:
            return line
        if not line and process.poll() is not None:
            raise RuntimeError(f"serve cloud exited {process.returncode}: {process.stderr.read()[-3000:]}")
    raise RuntimeError("serve cloud printed no ready line")


def _tokens(result: dict | None):
    if result is None:
        return None
    return result["tokens"] if result["type"] == "done" else {"error": result.get("message")}


def ray_cluster(port: int) -> str:
    """A Ray head on loopback (`ray start --head`), which the scenarios' clouds join (--ray-address)."""
    ray = str(Path(sys.executable).parent / "ray")
    head = [ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "4"]
    started = subprocess.run([*head, "--include-dashboard=false", "--disable-usage-stats"], capture_output=True)
    if started.returncode != 0:
        raise RuntimeError(f"ray start failed: {started.stderr.decode()[-2000:]}")
    address = f"127.0.0.1:{port}"
    _wait_for_raylet(ray, address)
    return address


def _wait_for_raylet(ray: str, address: str, timeout_s: float = 90) -> None:
    """`ray start` returns before the node is usable: on a loaded 2-core machine (two pytest workers)
    the first cloud that joined right after it failed with "Failed to register worker to Raylet".
    The node is usable once `ray status` lists its resources."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = subprocess.run([ray, "status", "--address", address], capture_output=True, text=True)
        if status.returncode == 0 and "CPU" in status.stdout:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Ray head at {address} never became usable: {status.stderr[-2000:]}")
        time.sleep(1)


def main(out: str) -> None:
    target, drafter = model_pair(noise=0.05, family="qwen3")
    reports: dict = {
        name: [decode_target_only(target, None, DecodeRequest(tuple(p), max_new_tokens=n)).tokens for p in PROMPTS]
        for name, n in (("expected", TOKENS), ("expected_kill_round", KILL_ROUND_TOKENS))
    }
    # Ray's token authentication, with a token of this run's own: `ray start --head` does not make
    # one (it failed on a fresh machine without ~/.ray/auth_token), and every process started from
    # here (the head, the clouds that join it) reads it from the environment.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    address = ray_cluster(free_port())
    joined = ["--ray-address", address]
    try:
        with tempfile.TemporaryDirectory() as scratch:
            target_dir = save_tiny(target, Path(scratch) / "target")
            reports["resync"] = scenario(target_dir, drafter, joined, kill=True, timeout_s=60)
            reports["unsticky"] = scenario(target_dir, drafter, [*joined, "--unsticky-routing"], False, 6)
            control = [*joined, "--no-resync-on-death", "--replica-restarts", "0"]
            reports["no_resync"] = scenario(target_dir, drafter, control, kill=True, timeout_s=5)
    finally:
        subprocess.run([str(Path(sys.executable).parent / "ray"), "stop", "--force"], capture_output=True)
    Path(out).write_text(json.dumps(reports, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
