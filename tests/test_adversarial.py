"""The adversarial suite (issues 15 and 24): live services on tiny models take 20,000 random and
mutated protocol frames each (cloud, edge) from one peer, and 1,000 hostile HTTP requests each
(edge API, `listen`) over real sockets to the served app (connection guard and uvicorn). During
every batch a normal request is in flight and the hostile frames name its id; after every batch
both services run, that request and a new one equal target-only decoding, every frame of the
peer is counted (decoded, or dropped), no decoder error and no request error occurred, and the
Python bytes retained per frame once warm stay under the bound (a leaky handler is the negative
control). Every hostile HTTP request gets a 4xx with an error body; a load test of concurrent
clients over HTTP loses nothing and records p50/p99.

Set ASYNCSPEC_HARDENING_REPORT=FILE.json to record the figures (docs/hardening.md quotes them)."""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
import tracemalloc
from collections import Counter

import httpx
import pytest
import torch
import zmq

from adversarial_frames import frames, hostile_edge_request, hostile_listen_request, mutated
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud import CloudConfig
from asyncspec.cloudedge.edge import EdgeGateway
from asyncspec.cloudedge.http import make_app
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.commands.listen import MULTIPART_OVERHEAD_BYTES
from asyncspec.connguard import ConnectionLimits
from asyncspec.httpguard import GuardConfig
from asyncspec.ondemand.engine import Engine
from asyncspec.ondemand.ingest import LatestWindow
from asyncspec.ondemand.prepared_state import Preparer
from asyncspec.ondemand.service import UploadLimits, create_app
from asyncspec.transcription.longform import LongformOptions
from cloudedge_support import Collector, ServiceThread, free_address, model_pair, wait_until
from conftest import synthetic_speech, tiny_whisper
from frame_fuzzing import (
    FUZZ_IDENTITY,
    CloudOwner,
    FrameAccount,
    FrontOwner,
    LeakyCloud,
    drain,
    idle,
    owner_tokens,
    retained_python_bytes,
    start_tracing,
    steady_growth,
)
from hardening_support import RawPeer, expected_tokens, live_services, normal_request_problem, rss_mib, served

FRAMES = 20_000
HTTP_REQUESTS = 1_000
CLIENTS, LOAD_S = 8, 10.0  # the load test: concurrent HTTP clients, and for how long
BATCHES = 8
RSS_GROWTH_BOUND_MIB = 400  # over the whole suite, on top of the models and the first batch
POLICY = EdgePolicy(block_size=4, dead_after_s=2.0, give_up_s=30.0, max_active=8, max_waiting=64)
FIGURES: dict = {}


def record(name: str, **figures) -> None:
    FIGURES[name] = figures
    path = os.environ.get("ASYNCSPEC_HARDENING_REPORT")
    if path:
        with open(path, "w") as out:
            json.dump(FIGURES, out, indent=1)


@pytest.fixture(scope="module")
def pair():
    return model_pair(noise=0.3)


@pytest.fixture(scope="module")
def live(pair):
    config = CloudConfig(max_requests=256, max_requests_per_peer=128)
    with live_services(pair[0], pair[1], config, POLICY) as services:
        yield services


@pytest.fixture(scope="module")
def expected(pair):
    return expected_tokens(pair[0])


@pytest.fixture(scope="module")
def baseline_rss(live, pair, expected):
    assert normal_request_problem(live, pair[0], expected) is None
    return rss_mib()


# Python bytes the services retain per frame once warm: the bound. Before the hostile-frame
# generator's own allocations were left out (frame_fuzzing.GENERATOR_FILES), the edge measured
# 0.8-2.4 here, most of it the generator's; the control below leaks 100 and is measured at ~140.
LEAK_BOUND_BYTES_PER_FRAME = 1.0


def fuzz_batches(live, pair, address: str, account: FrameAccount, name: str, fixed_ids, owner, baseline_rss) -> dict:
    """BATCHES batches of hostile frames from one peer. During each, a normal request (`owner`) is
    in flight and the batch names its id; after each, every frame of the peer is accounted for
    exactly, both services run, the owner's answer and a new normal request equal target-only, and
    the peer's requests are closed so that what Python retains can be compared batch to batch."""
    rng = random.Random(15)
    peer = RawPeer(address, SNDHWM=0, RCVHWM=0, ROUTING_ID=FUZZ_IDENTITY)
    problems, sent, replies, retained, peak = [], 0, 0, [], rss_mib()
    start_tracing()
    try:
        for _ in range(BATCHES):
            started = owner.start()
            owned = started.ids()
            for parts in frames(rng, FRAMES // BATCHES, fixed_ids + owned * len(fixed_ids)):
                peer.send(*parts)  # the frames are not kept: what Python retains is the services'
                replies += drain(peer)
                sent += 1
            assert wait_until(lambda n=sent: account.received() == n), f"{account.received()} of {sent} frames seen"
            assert live.alive(), f"a service died during the {name} batch"
            problems += [p for p in (started.problem(), normal_request_problem(live, pair[0])) if p]
            # every request the peer opened (random frames can open ids of their own), ended the
            # protocol's own way: the services' state goes back to its baseline between batches
            opened = owner.opened_by(FUZZ_IDENTITY)
            for request in opened:
                peer.send_message(wire.Close(request))
            sent += len(opened)
            assert wait_until(lambda n=sent: account.received() == n and idle(live)), "the batch did not settle"
            replies += drain(peer)
            retained.append((sent, retained_python_bytes()))
            peak = max(peak, rss_mib())
    finally:
        tracemalloc.stop()
        peer.close()
    per_frame = steady_growth(retained)
    figures = {"frames": sent, "replies": replies, "failed_normal_requests": len(problems), **account.figures()}
    figures |= {"retained_bytes_per_frame": round(per_frame, 3), "peak_rss_mib": round(peak, 1)}
    figures["retained_bytes_per_batch"] = [size for _, size in retained]
    figures |= {"baseline_rss_mib": round(baseline_rss, 1)}
    record(name, **figures, services_alive=live.alive())
    assert problems == [], problems
    assert figures["decoder_errors"] == 0 and figures["request_errors"] == 0, figures
    series = figures["retained_bytes_per_batch"]
    assert per_frame <= LEAK_BOUND_BYTES_PER_FRAME, f"{per_frame:.2f} bytes per frame; retained per batch {series}"
    assert peak - baseline_rss < RSS_GROWTH_BOUND_MIB, figures  # tensors (KV caches) tracemalloc does not see
    return figures


def test_20000_hostile_frames_to_the_cloud(live, pair, baseline_rss):
    requests = [random.Random(i).randrange(2**64) for i in range(40)] + [0, 2**64 - 1]
    account = FrameAccount(live.cloud.traffic, lambda: live.cloud.counters.request_errors)
    owner = CloudOwner(live, owner_tokens(pair[0]))
    fuzz_batches(live, pair, live.cloud_address, account, "cloud", requests, owner, baseline_rss)
    counters = live.cloud.counters
    assert counters.invalid_frames > 0 and counters.nacks  # hostile frames were refused, with Nacks
    handled = {"opens": counters.opens, "batches": counters.batches, "verified_positions": counters.positions_verified}
    FIGURES["cloud"].update(handled, nacks=dict(counters.nacks))
    record("cloud", **FIGURES["cloud"])
    assert len(live.cloud.requests) <= 256 and live.cloud.replies.bytes <= live.cloud.config.decision_cache_bytes


def test_20000_hostile_frames_to_the_edge(live, pair, baseline_rss):
    account = FrameAccount(live.front.channel.counters, lambda: live.gateway.counters.request_errors)
    expected_text = pair[1].tokenizer.decode(owner_tokens(pair[0]))
    owner = FrontOwner(live.client_address, expected_text)
    try:
        fuzz_batches(live, pair, live.client_address, account, "edge", list(range(50)), owner, baseline_rss)
    finally:
        owner.peer.close()


def test_the_leak_measure_catches_100_bytes_per_frame(pair):
    """The negative control of the bytes-per-frame bound: the same measure on a cloud that leaks."""
    config = CloudConfig(max_requests=64, max_requests_per_peer=32)
    with live_services(pair[0], pair[1], config, POLICY) as services:
        leaky = LeakyCloud(services.cloud)
        peer = RawPeer(services.cloud_address, ROUTING_ID=FUZZ_IDENTITY)
        start_tracing()
        try:
            retained, heard = [], services.cloud.traffic.per_peer_received
            for batch in range(1, 7):
                for _ in range(250):
                    peer.send_message(wire.Ping(0.0))
                assert wait_until(lambda n=250 * batch: heard[FUZZ_IDENTITY] == n)
                drain(peer)
                retained.append((250 * batch, retained_python_bytes()))
        finally:
            tracemalloc.stop()
            peer.close()
    per_frame = steady_growth(retained)
    assert len(leaky.kept) >= 1500 and per_frame > 10 * LEAK_BOUND_BYTES_PER_FRAME, per_frame


def check_http(client, requests, exact, name: str, baseline_rss: float) -> None:
    statuses, failed_normal, peak = {}, 0, baseline_rss
    for i, request in enumerate(requests):
        method = request.pop("method", "POST")
        path = request.pop("path", "/v1/audio/transcriptions")
        response = client.request(method, path, **request)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:200])
        assert response.json()["error"]["message"], response.text[:300]
        if (i + 1) % (len(requests) // BATCHES) == 0:
            failed_normal += not exact()
            peak = max(peak, rss_mib())
    record(name, requests=len(requests), failed_normal_requests=failed_normal,
           statuses={str(k): v for k, v in sorted(statuses.items())}, peak_rss_mib=round(peak, 1))  # fmt: skip
    assert failed_normal == 0 and peak - baseline_rss < RSS_GROWTH_BOUND_MIB


NORMAL_COMPLETION = {"prompt": "w3 w4 w5", "max_tokens": 12, "temperature": 0}


def test_1000_hostile_http_requests_to_the_edge(live, pair, expected, baseline_rss):
    """Over real sockets to the edge's served app (the connection guard and uvicorn, as `serve edge
    --http` runs them), not through an in-process test client."""
    app = make_app(live.gateway, pair[1].tokenizer, "tiny", guard=GuardConfig(max_body_bytes=1 << 20))
    rng = random.Random(16)
    limits = ConnectionLimits(max_body_bytes=1 << 20)  # as `serve edge` sets it from --http-max-body
    with served(app, limits=limits) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:

        def exact() -> bool:
            response = client.post("/v1/completions", json=NORMAL_COMPLETION)
            text = response.json()["choices"][0]["text"] if response.status_code == 200 else None
            return text is not None and pair[0].tokenizer.encode(text) == expected

        hostile = [hostile_edge_request(rng) for _ in range(HTTP_REQUESTS)]
        check_http(client, hostile, exact, "edge_http", baseline_rss)
    assert live.alive() and live.gateway.counters.request_errors == 0


def test_concurrent_clients_over_http_lose_nothing_and_stay_exact(live, pair, expected):
    """A load test against the served edge: CLIENTS concurrent clients for LOAD_S seconds. Every request
    gets an answer (200 equal to target-only, or a 429 with Retry-After when the edge is full: none
    vanishes or errs); p50/p99 latency recorded."""
    app = make_app(live.gateway, pair[1].tokenizer, "tiny")
    outcomes: list[tuple[int, float, bool]] = []
    lock = threading.Lock()

    def client_loop(base_url: str, stop_at: float) -> None:
        with httpx.Client(base_url=base_url, timeout=60) as client:
            while time.monotonic() < stop_at:
                started = time.monotonic()
                response = client.post("/v1/completions", json=NORMAL_COMPLETION)
                ok = (
                    response.status_code == 200
                    and pair[0].tokenizer.encode(response.json()["choices"][0]["text"]) == expected
                )
                refused = response.status_code == 429 and response.headers.get("retry-after") is not None
                with lock:
                    outcomes.append((response.status_code, time.monotonic() - started, ok or refused))

    with served(app) as base_url:
        stop_at = time.monotonic() + LOAD_S
        threads = [threading.Thread(target=client_loop, args=(base_url, stop_at)) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LOAD_S + 90)
    assert not any(thread.is_alive() for thread in threads), "a client hung"
    latencies = sorted(seconds for status, seconds, _ in outcomes if status == 200)
    statuses = Counter(status for status, _, _ in outcomes)
    record("edge_http_load", clients=CLIENTS, seconds=LOAD_S, requests=len(outcomes),
           statuses={str(k): v for k, v in sorted(statuses.items())},
           p50_ms=round(1000 * latencies[len(latencies) // 2], 1),
           p99_ms=round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1))  # fmt: skip
    assert latencies and all(good for _, _, good in outcomes), statuses
    assert live.gateway.counters.request_errors == 0


def test_1000_hostile_http_requests_to_listen(baseline_rss):
    target = tiny_whisper(torch.float32, seed=2)
    window = LatestWindow(4.0)
    uploads = LongformOptions(temperatures=(0.0,))  # a random model fails every check: no fallback
    engine = Engine(target, {}, window, Preparer(target, window).start(), None, 4, "target", upload_options=uploads)
    engine.start()
    app = create_app(engine, limits=UploadLimits(max_bytes=200_000))
    audio = synthetic_speech(1.0)
    reference = None
    rng = random.Random(17)

    def exact() -> bool:
        nonlocal reference
        import io

        import soundfile

        data = io.BytesIO()
        soundfile.write(data, audio, 16_000, format="WAV")
        files = {"file": ("ok.wav", data.getvalue(), "audio/wav")}
        response = client.post("/v1/audio/transcriptions", files=files, data={"response_format": "verbose_json"})
        if reference is None:
            reference = wire_free_reference(target, audio, uploads)
        return response.status_code == 200 and [s["tokens"] for s in response.json()["segments"]] == reference

    try:
        limits = ConnectionLimits(max_body_bytes=200_000 + MULTIPART_OVERHEAD_BYTES)  # as `listen` sets it
        with served(app, limits=limits) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
            hostile = [hostile_listen_request(rng) for _ in range(HTTP_REQUESTS)]
            check_http(client, hostile, exact, "listen_http", baseline_rss)
        # nothing lost: every request the engine accepted completed (the BATCHES normal ones) or
        # failed (hostile audio it could not decode), and each failure was a 4xx (check_http)
        counters = engine.counters
        assert engine.thread.is_alive() and counters.completed == BATCHES, counters
        assert counters.accepted == counters.completed + counters.failed and counters.cancelled == 0, counters
    finally:
        engine.close()


def wire_free_reference(target, audio, options) -> list[list[int]]:
    """The upload's segments' tokens as the library transcribes the same samples, without HTTP."""
    from asyncspec.transcription.api import Transcriber

    segments, _ = Transcriber.from_loaded(target, {}, "tiny").transcribe(audio, options, method="target")
    return [list(segment.tokens) for segment in segments]


def hostile_cloud_replies(rng: random.Random, socket, identity: bytes, message, drafter) -> int:
    """What a buggy or hostile cloud answers: a correct Pong to pings (so the edge keeps talking),
    and to every block a random, mutated or out-of-range reply for that block."""
    if isinstance(message, wire.Ping):
        pong = wire.Pong(message.sent, 1, drafter.vocab_size, drafter.max_length, 0)
        socket.send_multipart([identity, wire.encode(pong)])
        return 0
    if not isinstance(message, wire.Block | wire.CorrectionQuery):
        return 0
    block_id = message.id
    replies = [
        wire.Verdict(block_id, rng.randrange(block_id.n + 2), rng.choice([-1, 3, 95, 96, 10**6])),
        wire.Verdict(block_id, 0, -1, wire.pack_ids([1, 2]), wire.pack_probs([0.5, rng.choice([0.5, math.nan])])),
        wire.Correction(block_id, rng.choice(["topk", "full", "proposals"]), 0, wire.pack_ids([200]), b"\0\0\0\0"),
        wire.Nack(block_id.request, block_id.base, rng.choice(["unknown", "stale", "busy", "invalid"])),
    ]
    frame = wire.encode(rng.choice(replies))
    socket.send_multipart([identity, mutated(frame, rng) if rng.random() < 0.5 else frame])
    return 1


def test_hostile_cloud_replies_fail_only_their_requests(pair):
    """Up to 2,000 replies (at least 500) from a hostile cloud. The edge trusts no reply: impossible
    verdicts, NaN probabilities, token ids past the vocabulary and garbage frames fail their request
    with a clear error (or are resolved by a resync); no request hangs and the edge keeps serving."""
    context = zmq.Context.instance()
    fake = context.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    address = free_address()
    fake.bind(address)
    policy = EdgePolicy(block_size=3, heartbeat_s=0.1, dead_after_s=0.2, give_up_s=5.0, max_resyncs=5)
    gateway = EdgeGateway(pair[1], address, policy)
    thread = ServiceThread(gateway).start()
    rng, sent, collectors = random.Random(18), 0, []
    try:
        deadline = time.monotonic() + 60  # a busy shared machine gets fewer replies in; the figure is recorded
        while sent < 2000 and time.monotonic() < deadline:
            while sum(not c.done.is_set() for c in collectors) < 64:  # keep many requests in flight
                collector = Collector()
                gateway.submit([3, 4, 5], 6, wire.Sampling(rng.choice([0.0, 1.0]), 1), 0.0, collector)
                collectors.append(collector)
            if fake.poll(20):
                identity, frame = fake.recv_multipart()
                sent += hostile_cloud_replies(rng, fake, identity, wire.decode(frame), pair[1])
        alive = thread.thread.is_alive()
        wait_until(lambda: all(c.done.is_set() for c in collectors), 60)
        hung = sum(not c.done.is_set() for c in collectors)
    finally:
        thread.close()
        fake.close(linger=0)
    assert alive and sent >= 500 and hung == 0, (alive, sent, hung)
    errors = [c.result["message"] for c in collectors if c.result["type"] == "error"]
    assert errors and all(message for message in errors)
    kinds = Counter(message.split(" (")[0].split(":")[0] for message in errors)
    record("edge_from_hostile_cloud", replies=sent, requests=len(collectors), failed_with_error=len(errors),
           edge_alive=alive, hung=hung, request_errors=gateway.counters.request_errors,
           errors=dict(kinds))  # fmt: skip
    assert gateway.counters.request_errors == 0  # every bad reply failed its request by a check, not an exception
