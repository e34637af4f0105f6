"""The link proxy as a child process (`asyncspec link`), for benchmarks whose own process runs models.

A proxy thread inside a process that runs torch would share its GIL and be paced late; a child process
keeps the link's timing independent. On exit the child reports its byte counts, read back as LinkStats:
the wire bytes (ZeroMQ framing included) each direction carried.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from asyncspec.cloudedge.link.profiles import LinkProfile
from asyncspec.cloudedge.link.proxy import DirectionStats, LinkStats

READY_PREFIX = "link ready on "
CLOSED_PREFIX = "link closed: "


def stats_line(stats: LinkStats) -> str:
    return CLOSED_PREFIX + json.dumps(
        {
            "up": vars(stats.up),
            "down": vars(stats.down),
            "connections_total": stats.connections_total,
            "connect_failures": stats.connect_failures,
        }
    )


def parse_stats_line(line: str) -> LinkStats:
    record = json.loads(line.removeprefix(CLOSED_PREFIX))
    return LinkStats(
        up=DirectionStats(**record["up"]),
        down=DirectionStats(**record["down"]),
        connections_total=record["connections_total"],
        connect_failures=record["connect_failures"],
    )


class LinkProcess:
    """with LinkProcess(profile, target=("127.0.0.1", cloud_port)) as link: edge connects to link.address;
    after the block, link.stats holds what crossed the link."""

    def __init__(self, profile: LinkProfile, target: tuple[str, int], listen=("127.0.0.1", 0), client_is_edge=True):
        self.profile, self.target, self.listen, self.client_is_edge = profile, target, listen, client_is_edge
        self.process: subprocess.Popen | None = None
        self.address: tuple[str, int] | None = None
        self.stats: LinkStats | None = None

    def command(self) -> list[str]:
        p = self.profile
        return [sys.executable, "-m", "asyncspec", "link"] + [
            f"--up={p.up_mbit!r}",
            f"--down={p.down_mbit!r}",
            f"--up-delay-ms={p.up_delay_ms!r}",
            f"--down-delay-ms={p.down_delay_ms!r}",
            f"--listen={self.listen[0]}:{self.listen[1]}",
            f"--target={self.target[0]}:{self.target[1]}",
            f"--client-side={'edge' if self.client_is_edge else 'cloud'}",
        ]

    def __enter__(self) -> LinkProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            self.command(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        ready = self.process.stdout.readline()
        if not ready.startswith(READY_PREFIX):
            self.process.kill()
            _, errors = self.process.communicate()
            raise RuntimeError(f"the link process did not start: {(ready + errors).strip()}")
        host, port = ready.removeprefix(READY_PREFIX).split()[0].rsplit(":", 1)
        self.address = (host, int(port))
        return self

    def __exit__(self, *exc_info) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            _, errors = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, errors = self.process.communicate()
        lines = [line for line in errors.splitlines() if line.startswith(CLOSED_PREFIX)]
        self.stats = parse_stats_line(lines[-1]) if lines else None
