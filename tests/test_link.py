"""The emulated edge–cloud link: achieved rates and one-way delays per direction, ZeroMQ through it,
teardown from either side, and clear errors on bad profiles."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest
import zmq

from asyncspec.cli import EXIT_BAD_INPUT, main
from asyncspec.cloudedge.link.kernel import KernelShaper, kernel_shaping_available
from asyncspec.cloudedge.link.process import LinkProcess
from asyncspec.cloudedge.link.profiles import DEFAULT_LINK_SCALE, LinkProfile, resolve_profile
from asyncspec.cloudedge.link.proxy import LinkThread
from asyncspec.errors import InputError
from cloudedge_support import wait_until

TOLERANCE = 0.10
# A shaped link may be no faster than its profile (within TOLERANCE), but a loaded 2-core machine
# only ever adds time: seconds up to this share over, rates down to 1 / (1 + this), still pass
# (measured: 130 ms expected, 148 ms during a full test run; at load 4, two make runs on 2 cores,
# the proxy's thread gets about half a core). A delay left out or applied twice, or a rate off by
# 2x, still fails.
LOADED_SLACK = 0.75


def paced_like(seconds: float, expected: float) -> bool:
    return expected * (1 - TOLERANCE) <= seconds <= expected * (1 + LOADED_SLACK)


def rate_like(mbit: float, expected: float) -> bool:
    return expected / (1 + LOADED_SLACK) <= mbit <= expected * (1 + TOLERANCE)


class OneShotServer:
    """A TCP server on loopback that hands its first accepted connection to the test."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: socket.socket | None = None
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        self.accepted, _ = self.listener.accept()

    def connection(self, timeout: float = 5.0) -> socket.socket:
        self._thread.join(timeout)
        assert self.accepted is not None, "the proxy never connected upstream"
        return self.accepted

    def close(self):
        self.listener.close()
        if self.accepted is not None:
            self.accepted.close()


def connected_pair(link_profile: LinkProfile):
    """(link, client socket, server socket) joined through the link."""
    server = OneShotServer()
    link = LinkThread(link_profile, target=("127.0.0.1", server.port)).__enter__()
    client = socket.create_connection(link.address)
    return link, client, server.connection(), server


def receive_exactly(sock: socket.socket, n: int) -> float:
    """Read n bytes; returns the time the last one arrived."""
    remaining = n
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 16))
        assert chunk, "connection closed early"
        remaining -= len(chunk)
    return time.perf_counter()


def duplex_rates(profile: LinkProfile, n_up: int, n_down: int, kernel: bool = False) -> dict[str, float]:
    """Send n_up bytes up and n_down down at the same moment; achieved Mbit/s per direction (delay removed)."""
    server = OneShotServer()
    shaper = contextlib.nullcontext()
    proxy_profile = profile
    if kernel:
        from asyncspec.cloudedge.link.kernel import KernelShaper

        shaper = KernelShaper(profile, target_port=server.port)
        proxy_profile = shaper.userspace_profile()
    with shaper, LinkThread(proxy_profile, target=("127.0.0.1", server.port)) as link:
        client = socket.create_connection(link.address)
        server_side = server.connection()
        finished = {}
        start = time.perf_counter()
        threads = [
            threading.Thread(target=client.sendall, args=(b"u" * n_up,)),
            threading.Thread(target=server_side.sendall, args=(b"d" * n_down,)),
            threading.Thread(target=lambda: finished.setdefault("up", receive_exactly(server_side, n_up))),
            threading.Thread(target=lambda: finished.setdefault("down", receive_exactly(client, n_down))),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        client.close()
        server.close()
        assert link.stats.up.bytes_delivered == n_up and link.stats.down.bytes_delivered == n_down
    delays = {"up": profile.up_delay_ms / 1000, "down": profile.down_delay_ms / 1000}
    sizes = {"up": n_up, "down": n_down}
    return {d: sizes[d] * 8 / 1e6 / (finished[d] - start - delays[d]) for d in sizes if sizes[d]}


def test_rates_in_both_directions_at_once_match_the_settings():
    # 8 Mbit/s up, 16 down, with delay: 1.5 s of traffic each way, sent at the same time (full duplex),
    # so pipelining (delay per byte would collapse the rate) and direction independence are both tested.
    profile = resolve_profile(up_mbit=8, down_mbit=16, up_delay_ms=40, down_delay_ms=20)
    rates = duplex_rates(profile, n_up=1_500_000, n_down=3_000_000)
    assert rate_like(rates["up"], 8) and rate_like(rates["down"], 16), rates


KERNEL_PROBE = """
import json, sys
sys.path.insert(0, "tests")
from test_link import duplex_rates
from asyncspec.cloudedge.link.profiles import resolve_profile
profile = resolve_profile(up_mbit=16, down_mbit=32, up_delay_ms=30, down_delay_ms=10)
up = duplex_rates(profile, n_up=3_000_000, n_down=0, kernel=True)
down = duplex_rates(profile, n_up=0, n_down=6_000_000, kernel=True)
print(json.dumps(up | down))
"""


@pytest.mark.skipif(
    not (kernel_shaping_available() and shutil.which("unshare") and shutil.which("ip")),
    reason="kernel shaping needs root, tc, unshare and ip",
)
def test_kernel_htb_rates_with_userspace_delay():
    """In a private network namespace (its own loopback: nothing else on the machine is shaped). One
    direction at a time: in full duplex, TCP piggybacks the downlink's ACKs on queued uplink data, which
    slows the downlink as on a real asymmetric link (the userspace proxy terminates TCP and is exempt)."""
    script = f"ip link set lo up && {shlex.quote(sys.executable)} -c {shlex.quote(KERNEL_PROBE)}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("no permission to create a network namespace")
    assert done.returncode == 0, done.stderr
    rates = json.loads(done.stdout.strip().splitlines()[-1])
    assert rate_like(rates["up"], 16) and rate_like(rates["down"], 32), rates


def test_kernel_shaper_commands_classify_by_service_port():
    if not kernel_shaping_available():
        with pytest.raises(InputError, match="needs root"):
            KernelShaper(resolve_profile("weak"), target_port=5555)
        pytest.skip("kernel shaping needs root and tc: its refusal was checked, its tc commands were not")
    shaper = KernelShaper(resolve_profile("weak", scale=10), target_port=5555)
    commands = [" ".join(c) for c in shaper.commands()]
    assert "htb rate 5000000bit ceil 5000000bit burst 131072" in commands[1]
    assert "htb rate 15000000bit" in commands[2]
    assert commands[4].endswith("0xffff at 2 match ip dport 5555 0xffff flowid 1:10")  # offload packets
    assert commands[5].endswith("0xffff at 2 match ip sport 5555 0xffff flowid 1:20")
    assert commands[6].endswith("0xff00 at 2 flowid 1:30")  # then ACKs
    assert commands[7].endswith("prio 3 u32 match ip dport 5555 0xffff flowid 1:10")
    assert commands[8].endswith("prio 3 u32 match ip sport 5555 0xffff flowid 1:20")
    assert shaper.userspace_profile().up_mbit == float("inf")
    assert shaper.userspace_profile().up_delay_ms == resolve_profile("weak").up_delay_ms


def test_one_way_delays_match_the_settings_per_direction():
    profile = resolve_profile(up_mbit=50, down_mbit=150, up_delay_ms=60, down_delay_ms=25)
    link, client, server_side, server = connected_pair(profile)
    up, down = [], []
    try:
        for _ in range(9):
            sent = time.perf_counter()
            client.sendall(b"p" * 64)
            receive_exactly(server_side, 64)
            up.append(time.perf_counter() - sent)
            sent = time.perf_counter()
            server_side.sendall(b"q" * 64)
            receive_exactly(client, 64)
            down.append(time.perf_counter() - sent)
    finally:
        client.close()
        server.close()
        link.__exit__(None, None, None)
    assert paced_like(statistics.median(up), 0.060), up
    assert paced_like(statistics.median(down), 0.025), down
    assert min(up) >= 0.060 and min(down) >= 0.025  # never early


def test_large_message_pays_serialisation_plus_delay():
    # 200 kB at 16 Mbit/s = 100 ms, plus 30 ms of propagation
    profile = resolve_profile(up_mbit=16, down_mbit=16, delay_ms=30)
    link, client, server_side, server = connected_pair(profile)
    try:
        sent = time.perf_counter()
        client.sendall(b"m" * 200_000)
        elapsed = receive_exactly(server_side, 200_000) - sent
    finally:
        client.close()
        server.close()
        link.__exit__(None, None, None)
    assert paced_like(elapsed, 0.130), elapsed


@pytest.mark.parametrize("pattern", [(zmq.REQ, zmq.REP), (zmq.DEALER, zmq.ROUTER)])
def test_zeromq_round_trip_through_the_link(pattern):
    client_type, server_type = pattern
    profile = resolve_profile(up_mbit=20, down_mbit=60, up_delay_ms=15, down_delay_ms=5)
    context = zmq.Context()
    server = context.socket(server_type)
    server.linger = client_linger = 0
    port = server.bind_to_random_port("tcp://127.0.0.1")
    with LinkThread(profile, target=("127.0.0.1", port)) as link:
        client = context.socket(client_type)
        client.linger = client_linger
        client.connect(f"tcp://{link.address[0]}:{link.address[1]}")
        payload = b"block" * 2000  # 10 kB: 4 ms up at 20 Mbit/s
        round_trips = []
        for _ in range(3):
            sent = time.perf_counter()
            client.send(payload)
            assert server.poll(5000), "request never arrived"
            if server_type == zmq.ROUTER:
                identity, request = server.recv_multipart()
                server.send_multipart([identity, request[::-1]])
            else:
                request = server.recv()
                server.send(request[::-1])
            assert client.poll(5000), "reply never arrived"
            assert client.recv() == payload[::-1]
            round_trips.append(time.perf_counter() - sent)
        client.close()
    server.close()
    context.term()
    # 15 + 5 ms propagation + 4 ms + 1.3 ms serialisation
    assert paced_like(statistics.median(round_trips), 0.025), round_trips
    assert link.stats.up.bytes_delivered > 3 * len(payload)


def test_client_close_reaches_the_server_and_frees_the_connection():
    link, client, server_side, server = connected_pair(resolve_profile("weak", delay_ms=20))
    try:
        client.sendall(b"last words")
        client.close()
        server_side.settimeout(5)
        assert receive_exactly(server_side, 10)
        assert server_side.recv(100) == b""  # EOF after the data, not instead of it
        server_side.close()
        assert wait_until(lambda: link.stats.connections_open == 0, 5.0, poll_s=0.01), link.stats
    finally:
        server.close()
        link.__exit__(None, None, None)


def test_server_close_reaches_the_client_and_frees_the_connection():
    link, client, server_side, server = connected_pair(resolve_profile("medium", delay_ms=20))
    try:
        server_side.close()
        client.settimeout(5)
        assert client.recv(100) == b""
        client.close()
        assert wait_until(lambda: link.stats.connections_open == 0, 5.0, poll_s=0.01), link.stats
    finally:
        server.close()
        link.__exit__(None, None, None)


def test_half_close_still_carries_the_answer():
    link, client, server_side, server = connected_pair(resolve_profile("strong", delay_ms=10))
    try:
        client.sendall(b"question")
        client.shutdown(socket.SHUT_WR)
        server_side.settimeout(5)
        client.settimeout(5)
        assert receive_exactly(server_side, 8) and server_side.recv(10) == b""
        server_side.sendall(b"answer")
        server_side.shutdown(socket.SHUT_WR)
        assert receive_exactly(client, 6) and client.recv(10) == b""
        assert wait_until(lambda: link.stats.connections_open == 0, 5.0, poll_s=0.01), link.stats
    finally:
        client.close()
        server.close()
        link.__exit__(None, None, None)


def test_unreachable_target_closes_the_client():
    spare = socket.create_server(("127.0.0.1", 0))
    dead_port = spare.getsockname()[1]
    spare.close()  # nothing listens there now
    with LinkThread(resolve_profile("weak"), target=("127.0.0.1", dead_port)) as link:
        client = socket.create_connection(link.address)
        client.settimeout(5)
        try:
            assert client.recv(10) == b""
        except ConnectionResetError:
            pass
        client.close()
        assert wait_until(lambda: link.stats.connections_open == 0, 5.0, poll_s=0.01)
        assert link.stats.connect_failures == 1


def test_profiles_and_link_scale():
    weak = resolve_profile("weak")
    assert (weak.up_mbit, weak.down_mbit) == (50, 150) and weak.up_delay_ms == weak.down_delay_ms > 0
    assert (resolve_profile("strong").up_mbit, resolve_profile("strong").down_mbit) == (250, 2500)
    scaled = resolve_profile("medium", scale=DEFAULT_LINK_SCALE)
    assert scaled.up_mbit == pytest.approx(150 / DEFAULT_LINK_SCALE) and scaled.scale == DEFAULT_LINK_SCALE
    assert scaled.down_mbit == pytest.approx(1000 / DEFAULT_LINK_SCALE)
    custom = resolve_profile(up_mbit=10, down_mbit=20, delay_ms=5, down_delay_ms=7)
    assert (custom.up_delay_ms, custom.down_delay_ms, custom.name) == (5, 7, "custom")
    assert resolve_profile("weak", up_mbit=20).up_mbit == 20


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "wifi"}, "unknown link profile 'wifi'"),
        ({}, "give a link profile"),
        ({"up_mbit": 10}, "give a link profile"),
        ({"up_mbit": -1, "down_mbit": 10}, "uplink rate must be a positive"),
        ({"name": "weak", "down_mbit": 0}, "downlink rate must be a positive"),
        ({"name": "weak", "delay_ms": -5}, "one-way delay must be"),
        ({"name": "weak", "up_delay_ms": float("inf")}, "uplink delay must be"),
        ({"name": "weak", "scale": 0}, "link scale must be"),
        ({"name": "weak", "scale": float("nan")}, "link scale must be"),
    ],
)
def test_bad_profiles_get_clear_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        resolve_profile(**kwargs)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--profile", "wifi", "--target", "127.0.0.1:5555"], "unknown link profile"),
        (["--profile", "weak", "--target", "nohost"], "--target must be HOST:PORT"),
        (["--profile", "weak", "--target", "127.0.0.1:99999"], "--target must be HOST:PORT"),
        (["--profile", "weak", "--link-scale", "-2", "--target", "127.0.0.1:1"], "link scale"),
    ],
)
def test_cli_rejects_bad_link_arguments(args, message, capsys):
    assert main(["link", *args]) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_cli_link_serves_until_terminated():
    server = OneShotServer()
    command = [sys.executable, "-m", "asyncspec", "link", "--profile", "weak", "--link-scale", "10"]
    command += ["--delay-ms", "20", "--target", f"127.0.0.1:{server.port}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proxy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready = proxy.stdout.readline()
        assert ready.startswith("link ready on 127.0.0.1:"), ready + proxy.stderr.read()
        assert "up 5 Mbit/s, down 15 Mbit/s" in ready and "link scale 10" in ready
        port = int(ready.split()[3].rsplit(":", 1)[1])
        client = socket.create_connection(("127.0.0.1", port))
        sent = time.perf_counter()
        client.sendall(b"hello")
        server_side = server.connection()
        receive_exactly(server_side, 5)
        assert time.perf_counter() - sent >= 0.020
        client.close()
    finally:
        proxy.send_signal(signal.SIGTERM)
        _, errors = proxy.communicate(timeout=10)
        server.close()
    assert proxy.returncode == 0, errors
    assert "link closed" in errors


def test_a_flooding_sender_is_held_back_not_buffered_without_bound():
    # 8 Mbit/s = 1 MB/s; the sender offers 40 MB at once: the proxy must stop reading (TCP backpressure)
    link, client, server_side, server = connected_pair(resolve_profile(up_mbit=8, down_mbit=8, delay_ms=50))
    try:

        def flood():
            with contextlib.suppress(OSError):  # the test closes the socket under it
                client.sendall(b"f" * 40_000_000)

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        line = next(iter(link.proxy.connections)).client.outgoing
        peak = 0
        for _ in range(40):
            time.sleep(0.025)
            peak = max(peak, line.queued_bytes)
        assert sender.is_alive(), "40 MB cannot have left through a 1 MB/s link in one second"
        assert 0 < peak <= line.high_water + 256 * 1024, (peak, line.high_water)
    finally:
        client.close()
        server.close()
        link.__exit__(None, None, None)


def test_link_process_carries_zeromq_and_reports_wire_bytes():
    context = zmq.Context()
    server = context.socket(zmq.REP)
    server.linger = 0
    port = server.bind_to_random_port("tcp://127.0.0.1")
    profile = resolve_profile("weak", scale=10, delay_ms=5)
    with LinkProcess(profile, target=("127.0.0.1", port)) as link:
        client = context.socket(zmq.REQ)
        client.linger = 0
        client.connect(f"tcp://{link.address[0]}:{link.address[1]}")
        for _ in range(4):
            client.send(b"u" * 50_000)
            assert server.poll(5000)
            server.recv()
            server.send(b"d" * 1000)
            assert client.poll(5000)
            assert len(client.recv()) == 1000
        client.close()
    server.close()
    context.term()
    # payload plus ZeroMQ's greeting and frame headers (a few dozen bytes per message)
    assert 200_000 < link.stats.up.bytes_delivered < 200_000 + 1000, link.stats
    assert 4_000 < link.stats.down.bytes_delivered < 4_000 + 1000, link.stats
    assert link.stats.connections_total == 1 and link.stats.connect_failures == 0


def test_the_default_link_scale_restores_the_papers_upload_to_verify_ratio():
    """A block's upload over the scaled link, over this CPU's verification time, is the paper's
    upload over its GPU verification time: within the 25% the default rounds down by (44 -> 40),
    on both directions of every profile, and never overstating the network's share."""
    from asyncspec.cloudedge.link.profiles import CPU_VERIFY_S_WIDTH8, GPU_VERIFY_S_32B_A100, PROFILE_RATES_MBIT

    block_bytes = 1_000  # the ratio is the same for any payload
    for name in PROFILE_RATES_MBIT:
        paper, here = resolve_profile(name), resolve_profile(name, scale=DEFAULT_LINK_SCALE)
        for rate in ("up_bytes_per_s", "down_bytes_per_s"):
            paper_ratio = block_bytes / getattr(paper, rate) / GPU_VERIFY_S_32B_A100
            emulated_ratio = block_bytes / getattr(here, rate) / CPU_VERIFY_S_WIDTH8
            assert 0.8 < emulated_ratio / paper_ratio <= 1.0, (name, rate)
        assert (here.up_delay_ms, here.down_delay_ms) == (paper.up_delay_ms, paper.down_delay_ms)  # not scaled


def test_cli_reports_a_busy_listen_port(capsys):
    busy = socket.create_server(("127.0.0.1", 0))
    try:
        port = busy.getsockname()[1]
        assert main(["link", "--profile", "weak", "--listen", f"127.0.0.1:{port}", "--target", "127.0.0.1:1"]) == 2
    finally:
        busy.close()
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
