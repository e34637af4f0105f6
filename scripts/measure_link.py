"""Measure what the emulated link achieves: rate per direction (1 s of traffic, one direction at a time) and
one-way delay per direction (median of small messages), for each profile, through `asyncspec link` run as a
child process (LinkProcess), as a benchmark would run it.

    PYTHONPATH=src python scripts/measure_link.py --scales 1 40
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time

from asyncspec.cloudedge.link.process import LinkProcess
from asyncspec.cloudedge.link.profiles import PROFILE_RATES_MBIT, LinkProfile, resolve_profile


def _pair(profile: LinkProfile):
    listener = socket.create_server(("127.0.0.1", 0))
    link = LinkProcess(profile, target=listener.getsockname()).__enter__()
    client = socket.create_connection(link.address)
    server, _ = listener.accept()
    listener.close()
    return link, client, server


def _receive(sock: socket.socket, n: int) -> float:
    while n:
        n -= len(sock.recv(min(n, 1 << 20)) or b"x" * n)
    return time.perf_counter()


def achieved_mbit(profile: LinkProfile, direction: str, seconds: float = 1.0) -> float:
    link, client, server = _pair(profile)
    if direction == "up":
        rate, delay = profile.up_bytes_per_s, profile.up_delay_ms
    else:
        rate, delay = profile.down_bytes_per_s, profile.down_delay_ms
    sender, receiver = (client, server) if direction == "up" else (server, client)
    payload = b"x" * int(rate * seconds)
    thread = threading.Thread(target=sender.sendall, args=(payload,))
    start = time.perf_counter()
    thread.start()
    finished = _receive(receiver, len(payload))
    thread.join()
    client.close(), server.close(), link.__exit__(None, None, None)
    return len(payload) * 8 / 1e6 / (finished - start - delay / 1000)


def one_way_ms(profile: LinkProfile, pings: int = 15) -> tuple[float, float]:
    link, client, server = _pair(profile)
    up: list[float] = []
    down: list[float] = []
    for _ in range(pings):
        for sender, receiver, samples in ((client, server, up), (server, client, down)):
            sent = time.perf_counter()
            sender.sendall(b"p" * 64)
            samples.append((_receive(receiver, 64) - sent) * 1000)
    client.close(), server.close(), link.__exit__(None, None, None)
    return statistics.median(up), statistics.median(down)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0])
    args = parser.parse_args()
    rows = []
    for scale in args.scales:
        for name in PROFILE_RATES_MBIT:
            profile = resolve_profile(name, scale=scale)
            up_ms, down_ms = one_way_ms(profile)
            row = {"profile": name, "link_scale": scale, "up_set": profile.up_mbit, "down_set": profile.down_mbit}
            row |= {"up_mbit": achieved_mbit(profile, "up"), "down_mbit": achieved_mbit(profile, "down")}
            row |= {"delay_set_ms": profile.up_delay_ms, "up_delay_ms": up_ms, "down_delay_ms": down_ms}
            rows.append({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
            print(
                f"{name:6} x1/{scale:g}: up {row['up_mbit']:.1f}/{row['up_set']:.1f} Mbit/s, "
                f"down {row['down_mbit']:.1f}/{row['down_set']:.1f}; one-way delay up {up_ms:.2f} ms, "
                f"down {down_ms:.2f} ms (set {profile.up_delay_ms:g})"
            )
    print(json.dumps({"loadavg": os.getloadavg(), "results": rows}))


if __name__ == "__main__":
    main()
