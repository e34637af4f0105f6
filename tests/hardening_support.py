"""Live services for the hardening tests: a cloud and an edge (with its client socket) in threads of
this process over real ZeroMQ sockets, a raw peer that sends arbitrary frames, and the check that a
normal request still succeeds and equals target-only decoding after hostile input."""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import zmq

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.client import ClientFront
from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
from asyncspec.cloudedge.edge import EdgeGateway
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.base import DecodeRequest
from cloudedge_support import ServiceThread, free_address, run_requests

NORMAL_PROMPT = [3, 4, 5]
NORMAL_TOKENS = 12
POLICY = EdgePolicy(block_size=4, dead_after_s=2.0, give_up_s=30.0)


@dataclass
class LiveServices:
    gateway: EdgeGateway
    cloud: CloudVerifier
    cloud_address: str
    client_address: str
    cloud_thread: ServiceThread
    edge_thread: ServiceThread
    front: ClientFront

    def alive(self) -> bool:
        """Both service threads still run (a service that died would have stopped its thread)."""
        return self.cloud_thread.thread.is_alive() and self.edge_thread.thread.is_alive()


@contextmanager
def live_services(target, drafter, cloud_config: CloudConfig | None = None, policy: EdgePolicy | None = None):
    cloud_address, client_address = free_address(), free_address()
    cloud = CloudVerifier(target, cloud_config or CloudConfig())
    cloud_thread = ServiceThread(cloud, cloud_address).start()
    gateway = EdgeGateway(drafter, cloud_address, policy or POLICY)
    front = ClientFront(client_address, drafter.tokenizer)
    edge_thread = ServiceThread(gateway, client=front).start()
    try:
        yield LiveServices(gateway, cloud, cloud_address, client_address, cloud_thread, edge_thread, front)
    finally:
        edge_thread.close()
        cloud_thread.close()


class RawPeer:
    """A DEALER socket that sends frames as they are, hostile or not, and reads what comes back."""

    def __init__(self, address: str, context: zmq.Context | None = None, **options):
        self.socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        for option, value in options.items():
            self.socket.setsockopt(getattr(zmq, option), value)
        self.socket.connect(address)

    def send(self, *frames: bytes) -> None:
        self.socket.send_multipart(list(frames))

    def send_message(self, message: wire.Message) -> None:
        self.socket.send(wire.encode(message))

    def replies(self, timeout_s: float = 2.0, until=None) -> list[wire.Message]:
        """Decoded replies until `until(message)` holds or nothing arrives for timeout_s."""
        out = []
        while self.socket.poll(int(timeout_s * 1000)):
            message = wire.decode(self.socket.recv())
            out.append(message)
            if until is not None and until(message):
                break
        return out

    def close(self) -> None:
        self.socket.close(linger=0)


def expected_tokens(target) -> list[int]:
    return decode_target_only(target, None, DecodeRequest(tuple(NORMAL_PROMPT), max_new_tokens=NORMAL_TOKENS)).tokens


def normal_request_problem(live: LiveServices, target, expected: list[int] | None = None) -> str | None:
    """None when a greedy request through the live pair completes and equals target-only decoding."""
    [result] = run_requests(live.gateway, [NORMAL_PROMPT], NORMAL_TOKENS, timeout=60)
    if result["type"] != "done":
        return f"the normal request failed: {result.get('message')}"
    if result["tokens"] != (expected or expected_tokens(target)):
        return f"the normal request was not exact: {result['tokens']}"
    return None


def normal_request_is_exact(live: LiveServices, target, expected: list[int] | None = None) -> bool:
    return normal_request_problem(live, target, expected) is None


def rss_mib() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / 2**20


@contextmanager
def served(app, max_requests: int = 64, limits=None):
    """The base URL of `app` served as the services serve it (httpserve.GuardedServer: the connection
    guard in front of uvicorn) on a free loopback port, over real sockets; stopped on exit."""
    from asyncspec.httpguard import bind_listening_socket
    from asyncspec.httpserve import GuardedServer

    listening = bind_listening_socket("127.0.0.1", 0)
    port = listening.getsockname()[1]
    with running_in_thread(GuardedServer(app, listening, max_requests, limits)):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def running_in_thread(server):
    """A uvicorn-like server (`run`, `started`, `should_exit`) in a daemon thread, until the block ends."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(10)
