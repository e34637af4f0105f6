"""Memory bounded by bytes (issue 24 item 4): the cloud admits requests by the KV bytes they
reserve, checks a frame's bytes before decoding it, drains its socket for a bounded time once
blocks wait, and the edge's client front caps requests per client and tokenizes off its loop.
Each check is also run against the old behaviour, where it fails."""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from concurrent.futures import Future

import msgpack
import pytest
import zmq

from asyncspec.cloudedge import limits
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.client import ClientFront
from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
from asyncspec.cloudedge.requests import DoneEvent
from asyncspec.cloudedge.transport import Channel, make_socket
from asyncspec.errors import InputError
from asyncspec.models.fixed_shape import StaticKV
from cloudedge_support import ServiceThread, free_address, model_pair
from hardening_support import RawPeer


@pytest.fixture(scope="module")
def pair():
    return model_pair(noise=0.05)


def open_message(request: int) -> wire.Open:
    return wire.Open(request, wire.pack_ids([3, 4]), 2, 0.0, 0, 4, 0)


def per_request(target) -> int:
    return target.empty_state().cache.nbytes()


# ------------------------------------------------------------------ admission by KV bytes


def budget_problem(target, config: CloudConfig) -> str | None:
    """Three Opens against a budget of 2.5 requests' KV: the third must be refused, saying why."""
    address = free_address()
    thread = ServiceThread(CloudVerifier(target, config), address).start()
    peer = RawPeer(address)
    try:
        for request in (1, 2, 3):
            peer.send_message(open_message(request))
        nacks = [m for m in peer.replies(timeout_s=1.0) if isinstance(m, wire.Nack)]
    finally:
        peer.close()
        thread.close()
    if [(n.request, n.reason) for n in nacks] != [(3, "full")]:
        return f"refusals {[(n.request, n.reason) for n in nacks]}"
    return None if "KV memory budget is full" in nacks[0].detail else f"unclear reason {nacks[0].detail!r}"


def test_opens_beyond_the_kv_budget_are_refused_with_the_reason(pair):
    target = pair[0]
    budget = int(2.5 * per_request(target))
    assert budget_problem(target, CloudConfig(kv_budget_bytes=budget)) is None
    # negative control: admission by count alone (the old quota) admits all three
    assert budget_problem(target, CloudConfig(kv_budget_bytes=10**15)) is not None


def test_the_default_budget_is_half_the_memory_and_a_request_costs_its_static_kv(pair):
    target = pair[0]
    assert isinstance(target.empty_state().cache, StaticKV)
    quota = CloudVerifier(target).quota
    assert quota.kv_per_request == per_request(target) > 0
    assert quota.kv_budget == int(0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    with pytest.raises(InputError, match="below one request's KV"):
        CloudVerifier(target, CloudConfig(kv_budget_bytes=per_request(target) - 1))


def test_the_edge_fails_a_refused_request_with_the_clouds_reason(pair):
    from asyncspec.cloudedge.policy import EdgePolicy
    from cloudedge_support import run_requests, services

    config = CloudConfig(kv_budget_bytes=per_request(pair[0]))  # room for one request
    with services(pair[0], pair[1], EdgePolicy(block_size=4), config) as (gateway, cloud, _):
        results = run_requests(gateway, [[3, 4, 5], [6, 7, 8]], 40)
    refused = [r for r in results if r["type"] == "error"]
    assert refused and all("KV memory budget is full" in r["message"] for r in refused)
    assert any(r["type"] == "done" for r in results) and cloud.counters.refused_opens >= 1


# ------------------------------------------------------------------ bytes before decoding


def peak_while(call) -> tuple[int, object]:
    tracemalloc.start()
    try:
        result = call()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def receive_peak(frame: bytes, caps: dict[int, int] | None) -> tuple[int, object]:
    """Peak bytes allocated while a ROUTER Channel (with these frame caps) receives `frame`."""
    context = zmq.Context.instance()
    address = free_address()
    router = Channel(make_socket(context, zmq.ROUTER, address, True), frame_caps=caps)
    dealer = make_socket(context, zmq.DEALER, address, False)
    try:
        dealer.send(frame)
        assert router.socket.poll(5000)
        return peak_while(router.receive)
    finally:
        dealer.close(linger=0)
        router.close()


def test_an_oversized_open_is_refused_before_it_is_decoded(pair):
    target = pair[0]
    frame = wire.encode(wire.Open(7, bytes([5]) * 900_000, 1, 0.0, 0, 0, 0))  # 900k ids, under MAX_WIRE_TOKENS
    caps = limits.cloud_frame_caps(target.max_length, target.vocab_size, 64)
    peak, received = receive_peak(frame, caps)
    assert received is None and peak < 2 * len(frame)
    # negative control: without the caps the same frame is decoded, and its ids cost ~40x its size
    peak, _ = receive_peak(frame, None)
    assert peak > 20 * len(frame)


def test_a_frame_of_nested_arrays_is_refused_while_it_is_parsed():
    frame = msgpack.packb([1, *([[]] * 200_000)])  # 200 kB of empty arrays
    peak, _ = peak_while(lambda: pytest.raises(wire.ProtocolError, wire.decode, frame))
    assert peak < 2 * len(frame)
    # negative control: msgpack without the container cap builds all of them (~60x)
    peak, _ = peak_while(lambda: msgpack.unpackb(frame))
    assert peak > 20 * len(frame)


def test_message_codes_are_read_without_decoding():
    for message in (open_message(1), wire.Ping(0.0), wire.Close(3)):
        assert wire.peek_code(wire.encode(message)) == message.code
    assert wire.peek_code(b"") is None and wire.peek_code(b"\xc0") is None


# ------------------------------------------------------------------ a time-bounded drain


class BlockTakesAWhile(CloudVerifier):
    """Admitting a block takes 0.3 s here, so the frames sent right behind it are all waiting in the
    socket when the drain goes on (otherwise the test's sender is slower than the cloud's reader)."""

    def _admit(self, identity, block):
        super()._admit(identity, block)
        time.sleep(0.3)


def verdict_position(target, config: CloudConfig, flood: int = 5000) -> tuple[int, int]:
    """(replies before the block's Verdict, replies in all) when a block is followed by `flood` Pings."""
    address = free_address()
    thread = ServiceThread(BlockTakesAWhile(target, config), address).start()
    peer = RawPeer(address)
    try:
        peer.send_message(open_message(1))
        block = wire.Block(wire.BlockId(1, 3, 2, wire.Sampling().digest()), 5, wire.pack_ids([6, 7]), b"")
        frames = [wire.encode(block)] + [wire.encode(wire.Ping(float(i))) for i in range(flood)]
        for frame in frames:
            peer.socket.send(frame)
        replies = peer.replies(timeout_s=2.0)
    finally:
        peer.close()
        thread.close()
    kinds = [type(m).__name__ for m in replies]
    return kinds.index("Verdict"), len(replies)


def test_a_flood_behind_a_block_does_not_hold_its_batch(pair):
    before, total = verdict_position(pair[0], CloudConfig())  # drain_s 5 ms
    assert total == 5001 and before < 100, (before, total)
    # negative control: a drain bounded by frames only reads the whole flood first
    before, total = verdict_position(pair[0], CloudConfig(drain_s=1e9))
    assert total == 5001 and before == 5000, (before, total)


# ------------------------------------------------------------------ the edge's client front


class FakeGateway:
    """Records submissions; nothing finishes unless the test says so."""

    def __init__(self):
        self.emits: list = []
        self.threads: set[str] = set()

    def submit(self, ids, max_new_tokens, sampling, eps_req, emit) -> int:
        self.threads.add(threading.current_thread().name)
        self.emits.append(emit)
        return len(self.emits)


class InlineExecutor:
    """The old behaviour: tokenizing in the caller's (the loop's) thread."""

    def submit(self, call, *args):
        future: Future = Future()
        future.set_result(call(*args))
        return future

    def shutdown(self, **_):
        pass


def generate(tag: int, prompt: str = "w3 w4") -> bytes:
    return wire.encode(wire.Generate(tag, prompt, 50, 0.0, 0, 0.0))


def drain_all(front: ClientFront, gateway, seconds: float = 1.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        front.drain(gateway)
        time.sleep(0.01)


def refused_per_client(tokenizer, max_per_client: int) -> tuple[int, int]:
    """(Failed replies to a client that sent 20 Generates, to one that sent 3)."""
    address = free_address()
    front, gateway = ClientFront(address, tokenizer, max_per_client=max_per_client), FakeGateway()
    greedy, modest = RawPeer(address), RawPeer(address)
    try:
        for tag in range(20):
            greedy.socket.send(generate(tag))
        for tag in range(3):
            modest.socket.send(generate(tag))
        drain_all(front, gateway)
        counts = [sum(isinstance(m, wire.Failed) for m in peer.replies(0.3)) for peer in (greedy, modest)]
        if max_per_client == 16:  # a finished request frees its place
            gateway.emits[0](DoneEvent((1,), "length", {}))
            greedy.socket.send(generate(99))
            drain_all(front, gateway, 0.5)
            assert not any(isinstance(m, wire.Failed) for m in greedy.replies(0.3))
    finally:
        greedy.close()
        modest.close()
        front.close()
    return counts[0], counts[1]


def test_the_client_front_caps_requests_in_flight_per_client(pair):
    assert refused_per_client(pair[1].tokenizer, 16) == (4, 0)
    # negative control: the old front (no cap) takes all 20
    assert refused_per_client(pair[1].tokenizer, 10**6) != (4, 0)


class SlowTokenizer:
    def __init__(self, inner, seconds: float):
        self.inner, self.seconds = inner, seconds

    def encode(self, text: str):
        time.sleep(self.seconds)  # a long prompt's tokenizing
        return self.inner.encode(text)

    def decode(self, ids):
        return self.inner.decode(ids)


def loop_held_s(tokenizer, executor) -> tuple[float, FakeGateway]:
    """How long one drain (a turn of the edge's loop) takes with a slow prompt waiting."""
    address = free_address()
    front, gateway = ClientFront(address, SlowTokenizer(tokenizer, 0.5), executor=executor), FakeGateway()
    client = RawPeer(address)
    try:
        client.socket.send(generate(1))
        assert front.socket.poll(5000)
        started = time.monotonic()
        front.drain(gateway)
        held = time.monotonic() - started
        drain_all(front, gateway)
    finally:
        client.close()
        front.close()
    return held, gateway


def test_prompts_are_tokenized_off_the_loop_thread(pair):
    held, gateway = loop_held_s(pair[1].tokenizer, None)
    assert held < 0.1 and len(gateway.emits) == 1
    assert gateway.threads and not gateway.threads & {threading.current_thread().name}
    # negative control: tokenizing in the loop holds it for the whole tokenization
    held, _ = loop_held_s(pair[1].tokenizer, InlineExecutor())
    assert held >= 0.5
