"""A loopback port that nothing listens on, for a service about to be started on it.

The port is drawn at random below the kernel's ephemeral range rather than taken from bind(0).
bind(0) hands out a port from the range the kernel also uses for the source ports of outgoing
connections, and it is free again the moment the probe closes. Between that probe and the
service's own bind, any connection on the machine (another worker's client, a ZeroMQ reconnect)
can take it; CI lost a run to exactly that ("Address already in use"). Below the range, only
another listener that picks at random can collide, and the probe bind still rules out any that
already holds the port."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Above Ray's worker ports (10002-19999 by default), which `ray start` refuses to share with its head
# port, and which its workers bind as they start.
LOWEST_PORT = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_START = 32768  # Linux's default; also below the IANA range other systems use
ATTEMPTS = 200


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def _binds(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that no socket holds now, drawn from below the ephemeral range."""
    highest = ephemeral_start() - 1
    if highest <= LOWEST_PORT:  # a machine whose ephemeral range starts low: nothing safer to draw from
        with socket.socket() as probe:
            probe.bind((host, 0))
            return probe.getsockname()[1]
    draw = random.SystemRandom()
    for _ in range(ATTEMPTS):
        port = draw.randint(LOWEST_PORT, highest)
        if _binds(host, port):
            return port
    raise OSError(f"no free port on {host} among {ATTEMPTS} drawn from {LOWEST_PORT}-{highest}")


def free_address(host: str = "127.0.0.1") -> str:
    """`tcp://host:port` for a free port (see free_port)."""
    return f"tcp://{host}:{free_port(host)}"
