"""Each finding of issue 15, reproduced against live services: one hostile frame or request must
get a clear error (a Nack or a Failed reply), and the services must go on serving exact results."""

from __future__ import annotations

import math

import pytest

from asyncspec.cloudedge import protocol as wire
from cloudedge_support import model_pair, run_requests
from hardening_support import RawPeer, expected_tokens, live_services, normal_request_is_exact

HUGE_SEED = 2**63


@pytest.fixture(scope="module")
def pair():
    return model_pair(noise=0.3)


@pytest.fixture(scope="module")
def live(pair):
    target, drafter = pair
    with live_services(target, drafter) as services:
        yield services


@pytest.fixture(scope="module")
def expected(pair):
    return expected_tokens(pair[0])


def open_frame(request: int, temperature: float = 0.0, seed: int = 0, tokens=(3, 4)) -> wire.Open:
    return wire.Open(request, wire.pack_ids(list(tokens)), len(tokens), temperature, seed, 4, 0)


def nack_for(peer: RawPeer, request: int) -> wire.Nack | None:
    for message in peer.replies(until=lambda m: isinstance(m, wire.Nack) and m.request == request):
        if isinstance(message, wire.Nack) and message.request == request:
            return message
    return None


def test_a_sampled_block_without_q_gets_a_nack_and_the_cloud_goes_on(live, pair, expected):
    peer = RawPeer(live.cloud_address)
    sampling = wire.Sampling(1.0, 5)
    peer.send_message(open_frame(901, 1.0, 5, tokens=(3, 4)))
    block = wire.Block(wire.BlockId(901, 3, 2, sampling.digest()), 5, wire.pack_ids([6, 7]), b"")
    peer.send_message(block)
    nack = nack_for(peer, 901)
    peer.close()
    assert nack is not None and nack.reason == "invalid"
    assert live.alive() and normal_request_is_exact(live, pair[0], expected)


@pytest.mark.parametrize("temperature, seed", [(1.0, -1), (math.nan, 0), (math.inf, 0), (-1.0, 0), (1e-45, 0)])
def test_an_open_with_a_bad_seed_or_temperature_gets_a_nack(live, pair, expected, temperature, seed):
    peer = RawPeer(live.cloud_address)
    peer.send_message(open_frame(902, temperature, seed))
    nack = nack_for(peer, 902)
    peer.close()
    assert nack is not None and nack.reason == "invalid"
    assert "temperature" in nack.detail or "seed" in nack.detail
    assert live.alive() and normal_request_is_exact(live, pair[0], expected)


@pytest.mark.parametrize("seed", [HUGE_SEED, 2**64 - 1])
def test_seeds_are_unsigned_64_bit_values_end_to_end(live, seed):
    """Seeds >= 2**63 broke the digest (struct "<q") on the cloud and the edge; they are valid seeds."""
    [result] = run_requests(live.gateway, [[3, 4, 5]], 6, wire.Sampling(1.0, seed))
    assert result["type"] == "done" and len(result["tokens"]) >= 1


@pytest.mark.parametrize("temperature, seed", [(1e39, 0), (1.0, -5), (math.nan, 0), (1e-45, 0)])
def test_a_generate_with_a_bad_seed_or_temperature_fails_only_itself(live, pair, expected, temperature, seed):
    peer = RawPeer(live.client_address)
    peer.send_message(wire.Generate(77, "w3 w4", 4, temperature, seed, 0.0))
    replies = peer.replies(until=lambda m: isinstance(m, wire.Failed | wire.Done))
    peer.close()
    assert isinstance(replies[-1], wire.Failed) and replies[-1].tag == 77
    assert "temperature" in replies[-1].message or "seed" in replies[-1].message
    assert live.alive() and normal_request_is_exact(live, pair[0], expected)


def test_a_frame_whose_code_is_a_list_is_malformed_not_a_crash():
    """Found by the adversarial suite: `[[1], ...]` raised TypeError (unhashable) inside decode."""
    import msgpack

    with pytest.raises(wire.ProtocolError):
        wire.decode(msgpack.packb([[1], 2, 3]))


def test_a_cancelled_request_stops_and_its_counters_are_freed(live):
    """HTTP clients that disconnect cancel their request (http.py calls gateway.cancel)."""
    from cloudedge_support import Collector

    collector = Collector()
    request_id = live.gateway.submit([3, 4, 5], 400, wire.Sampling(), 0.0, collector)
    live.gateway.cancel(request_id)
    assert collector.done.wait(30)
    assert collector.result["type"] == "error" and collector.result["message"] == "cancelled by the client"
    assert live.gateway.counters.cancelled >= 1
    assert request_id not in live.gateway.traffic.per_request_sent


def test_the_clouds_per_request_counters_do_not_grow_with_unknown_ids(live):
    peer = RawPeer(live.cloud_address)
    for request in range(5000, 5200):
        peer.send_message(wire.Close(request))
    peer.send_message(wire.Ping(0.0))
    peer.replies(until=lambda m: isinstance(m, wire.Pong))
    peer.close()
    traffic = live.cloud.traffic
    assert not any(5000 <= r < 5200 for r in [*traffic.per_request_received, *traffic.per_request_sent])


def test_open_prefills_run_outside_the_receive_loop(pair):
    """Handling an Open only queues its prefill; a flood of Opens does not hold up another
    request's block: the batch prefills only the requests whose blocks it verifies."""
    from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
    from test_cloudedge_batching import RecordingChannel

    cloud = CloudVerifier(pair[0], CloudConfig())
    cloud.channel = RecordingChannel()
    cloud.handle(b"edge", wire.Open(1, wire.pack_ids([3, 4]), 3, 0.0, 0, 4, 0))
    for request in range(100, 300):
        cloud.handle(b"flood", wire.Open(request, wire.pack_ids([3] * 200), 200, 0.0, 0, 4, 0))
    assert cloud.requests == {} and len(cloud.opening) == 201  # nothing prefilled while receiving
    cloud.handle(b"edge", wire.Block(wire.BlockId(1, 3, 2, wire.Sampling().digest()), 5, wire.pack_ids([6, 7]), b""))
    cloud.run_batch()
    assert isinstance(cloud.channel.sent[-1], wire.Verdict) and list(cloud.requests) == [1]
    assert len(cloud.opening) == 200
