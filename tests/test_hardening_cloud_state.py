"""The cloud's smaller state defects (issue 24): a different block at an answered position is not
given the old verdict (the reply cache is keyed by a digest of the block), a dead edge's requests
are freed at the cloud's liveness deadline, and byte counters exist only for requests that opened.
Each test has its control: the exact duplicate is still answered from the cache, a live peer's
request stays, an opened request is counted."""

from __future__ import annotations

import time

import pytest

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
from cloudedge_support import ServiceThread, free_address, model_pair
from hardening_support import RawPeer

GREEDY = wire.Sampling().digest()


@pytest.fixture(scope="module")
def pair():
    return model_pair(noise=0.05)


def opened(peer: RawPeer, request: int) -> None:
    peer.send_message(wire.Open(request, wire.pack_ids([3, 4]), 2, 0.0, 0, 4, 0))
    peer.send_message(wire.Ping(0.0))
    replies = peer.replies(timeout_s=30.0, until=lambda m: isinstance(m, wire.Pong))
    assert replies and isinstance(replies[-1], wire.Pong), f"request {request} was not opened: {replies}"


def block(request: int, candidates: list[int]) -> wire.Block:
    return wire.Block(wire.BlockId(request, 3, len(candidates), GREEDY), 5, wire.pack_ids(candidates), b"")


def test_a_different_block_at_an_answered_position_is_not_given_the_old_verdict(pair):
    address = free_address()
    cloud = CloudVerifier(pair[0], CloudConfig())
    thread = ServiceThread(cloud, address).start()
    peer = RawPeer(address)
    try:
        opened(peer, 7)
        peer.send_message(block(7, [6, 8]))
        [first] = peer.replies(until=lambda m: isinstance(m, wire.Verdict))
        peer.send_message(block(7, [6, 8]))  # control: the exact duplicate comes from the cache
        [again] = peer.replies(until=lambda m: isinstance(m, wire.Verdict))
        assert again == first and cloud.counters.answered_from_cache == 1
        peer.send_message(block(7, [9, 10, 11]))  # same (request, position), other contents
        [other] = peer.replies(timeout_s=1.0)
    finally:
        peer.close()
        thread.close()
    assert cloud.counters.answered_from_cache == 1 and other != first  # verified afresh: a stale Nack here
    assert isinstance(other, wire.Nack) and other.reason == "stale"


def test_a_dead_edges_requests_are_freed_at_the_liveness_deadline(pair):
    address = free_address()
    cloud = CloudVerifier(pair[0], CloudConfig(peer_dead_s=1.0))
    thread = ServiceThread(cloud, address).start()
    dead, live = RawPeer(address), RawPeer(address)
    try:
        opened(dead, 11), opened(live, 12)
        dead.close()  # the edge crashed: not a word more from it
        deadline = time.monotonic() + 30
        # 11 may still wait for its prefill (`opening`) on a loaded machine: it is held until freed
        while (11 in cloud.requests or 11 in cloud.opening) and time.monotonic() < deadline:
            live.send_message(wire.Ping(0.0))  # the live edge's heartbeat
            live.replies(timeout_s=0.2)
    finally:
        live.close()
        thread.close()
    assert 11 not in cloud.requests and 11 not in cloud.opening and cloud.counters.dead_peer_dropped == 1
    assert 12 in cloud.requests or 12 in cloud.opening  # control: the edge that kept its heartbeat keeps its request
    assert 11 not in cloud.quota.owner and 11 not in cloud.traffic.per_request_received


def test_byte_counters_only_for_requests_that_opened(pair):
    address = free_address()
    cloud = CloudVerifier(pair[0], CloudConfig())
    thread = ServiceThread(cloud, address).start()
    peer = RawPeer(address)
    try:
        opened(peer, 21)
        for request in range(1000, 1200):  # blocks for ids nobody opened, and invalid ones (Nacks)
            peer.send_message(block(request, [6]))
            peer.send_message(wire.Block(wire.BlockId(request, 3, 1, GREEDY), 5, b"\xff", b""))
        peer.replies(timeout_s=1.0)
    finally:
        peer.close()
        thread.close()
    counted = set(cloud.traffic.per_request_sent) | set(cloud.traffic.per_request_received)
    assert counted == {21}  # the control: the opened request is counted
