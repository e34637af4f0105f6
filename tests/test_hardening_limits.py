"""The cloud's resource bounds (issue 15), each reproduced from its finding: oversized blocks, unbounded
open requests, a reply cache bounded by count only, and a frame of any size accepted."""

from __future__ import annotations

import pytest

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
from asyncspec.cloudedge.limits import ReplyCache
from cloudedge_support import ServiceThread, free_address, model_pair
from hardening_support import RawPeer


@pytest.fixture(scope="module")
def target():
    return model_pair(noise=0.05)[0]


@pytest.fixture
def cloud(target):
    config = CloudConfig(max_block=8, max_requests=4, max_requests_per_peer=2, max_message_bytes=64 << 10)
    address = free_address()
    verifier = CloudVerifier(target, config)
    thread = ServiceThread(verifier, address).start()
    yield verifier, address
    thread.close()


def nacks(peer: RawPeer, timeout_s: float = 1.0) -> list[wire.Nack]:
    return [m for m in peer.replies(timeout_s=timeout_s) if isinstance(m, wire.Nack)]


def open_message(request: int) -> wire.Open:
    return wire.Open(request, wire.pack_ids([3, 4]), 2, 0.0, 0, 4, 0)


def test_a_block_wider_than_the_verification_width_is_refused(cloud):
    verifier, address = cloud
    peer = RawPeer(address)
    peer.send_message(open_message(1))
    wide = wire.Block(wire.BlockId(1, 3, 9, wire.Sampling().digest()), 5, wire.pack_ids([6] * 9), b"")
    peer.send_message(wide)
    [nack] = nacks(peer)
    peer.close()
    assert nack.reason == "invalid" and verifier.counters.positions_verified == 0


def test_open_requests_are_capped_per_connection_and_in_total(cloud):
    verifier, address = cloud
    first, second, third = RawPeer(address), RawPeer(address), RawPeer(address)
    for request in (10, 11, 12):
        first.send_message(open_message(request))
    assert [(n.request, n.reason) for n in nacks(first)] == [(12, "full")]
    for request in (20, 21):
        second.send_message(open_message(request))
    second.send_message(wire.Ping(0.0))  # answered after the Opens before it: the cloud is full now
    assert any(isinstance(m, wire.Pong) for m in second.replies(until=lambda m: isinstance(m, wire.Pong)))
    third.send_message(open_message(30))
    [refused] = nacks(third)
    for peer in (first, second, third):
        peer.close()
    assert "limit of 4 open requests" in refused.detail
    assert verifier.counters.refused_opens == 2 and len(verifier.requests) + len(verifier.opening) == 4


@pytest.mark.parametrize("limit, heard", [(64 << 10, 0), (1 << 20, 1)])
def test_a_frame_over_the_size_limit_is_dropped_and_the_cloud_goes_on(target, limit, heard):
    """Dropped, not slow: a Ping sent after the 90 KB frame on the same socket is answered, and by
    then the cloud has received only that Ping (its own frame counters). Control: under a 1 MiB
    ZeroMQ limit the same frame reaches the cloud before the Ping (and its Open cap drops it)."""
    verifier = CloudVerifier(target, CloudConfig(max_message_bytes=limit))
    address = free_address()
    thread = ServiceThread(verifier, address).start()
    big = RawPeer(address)
    try:
        big.send(wire.encode(wire.Open(40, wire.pack_ids([150_000] * 30_000), 2, 0.0, 0, 4, 0)))  # 90 KB
        big.send_message(wire.Ping(1.0))
        replies = big.replies(timeout_s=30.0, until=lambda m: isinstance(m, wire.Pong))
    finally:
        big.close()
        thread.close()
    assert replies and isinstance(replies[-1], wire.Pong)  # the cloud goes on, for this peer too
    assert sum(verifier.traffic.per_peer_received.values()) == 1 + heard and verifier.traffic.oversized == heard
    assert verifier.counters.pings == 1 and verifier.counters.opens == 0
    assert 40 not in verifier.requests and 40 not in verifier.opening


def test_the_reply_cache_is_capped_in_bytes():
    cache = ReplyCache(max_entries=1000, max_bytes=10_000)
    for i in range(50):
        cache.put((i, 0), b"x" * 600_000 if i == 7 else b"y" * 1000, None)
    assert cache.bytes <= 10_000 and len(cache) == 10 and (7, 0) not in cache
    cache.forget(49)
    assert (49, 0) not in cache and cache.bytes == 9000


def test_an_edge_beyond_the_clouds_request_limit_gets_a_clear_error(target):
    """A refused Open fails its request with the cloud's reason (it used to resync until max_resyncs)."""
    from asyncspec.cloudedge.policy import EdgePolicy
    from cloudedge_support import run_requests, services

    drafter = model_pair(noise=0.05)[1]
    config = CloudConfig(max_requests=1, max_requests_per_peer=1)
    with services(target, drafter, EdgePolicy(block_size=4), config) as (gateway, cloud, _):
        results = run_requests(gateway, [[3, 4, 5], [6, 7, 8]], 40)
    refused = [r for r in results if r["type"] == "error"]
    assert refused and all("limit of 1 open requests" in r["message"] for r in refused)
    assert any(r["type"] == "done" for r in results) and cloud.counters.refused_opens >= 1


def test_forgetting_a_request_touches_only_its_own_replies():
    cache = ReplyCache(max_entries=100_000, max_bytes=1 << 30)
    for request in range(20_000):
        cache.put((request, 1), b"v", None)
    cache.put((5, 2, "topk", 0), b"c", None)
    cache.forget(5)
    assert (5, 1) not in cache and (5, 2, "topk", 0) not in cache and len(cache) == 19_999
    assert 5 not in cache.by_request and len(cache.by_request) == 19_999
