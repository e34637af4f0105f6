"""Prometheus metrics on every service: the edge's /metrics, the cloud's `--metrics-port` server and
`listen`'s /metrics, scraped after real runs on the tiny models and checked against the figures the
requests' own answers carry (the `asyncspec` extension): equal, not merely present. A scrape that
counted a request twice must fail that check (the negative control)."""

from __future__ import annotations

import io
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass

import pytest
import soundfile
import torch
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from asyncspec.cloudedge.cloud_metrics import register_cloud
from asyncspec.cloudedge.correction import MODES
from asyncspec.cloudedge.edge import EdgeGateway
from asyncspec.cloudedge.edge_metrics import EdgeMetrics, accepted_per_position
from asyncspec.cloudedge.http import make_app
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import EdgeRequest
from asyncspec.errors import InputError
from asyncspec.httpguard import GuardConfig
from asyncspec.metrics import new_registry, serve_metrics
from asyncspec.ondemand.service import create_app
from cloudedge_support import (
    free_address,
    free_port,
    model_pair,
    save_tiny,
    services,
    spawn,
    stop_process,
    wait_ready,
    wait_until,
)
from conftest import synthetic_speech, tiny_whisper
from ondemand_helpers import make_engine

POLICY = EdgePolicy(block_size=4, dead_after_s=2.0, give_up_s=30.0)
COMPLETIONS = [  # greedy and sampled: the sampled ones exercise the corrections
    {"prompt": "w3 w4 w5", "max_tokens": 12, "temperature": 0},
    {"prompt": "w7 w1", "max_tokens": 10, "temperature": 0},
    {"prompt": "w9 w2 w11", "max_tokens": 12, "temperature": 0.8, "seed": 5},
    {"prompt": "w4 w6", "max_tokens": 12, "temperature": 1.0, "seed": 7},
]
API_KEY = "k" * 24


def scrape_text(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in samples.items() if sample == name and wanted <= set(have))


def edge_mismatches(samples: dict, answers: list[dict]) -> list[str]:
    """Where the edge's scrape disagrees with the requests' own figures (the responses' `asyncspec`
    extensions): the speculative-decoding counters, per position, corrections by mode, bytes, tokens."""
    stats = [answer["asyncspec"] for answer in answers]
    lengths = Counter()
    for figures in stats:
        lengths.update({int(n): blocks for n, blocks in figures["accepted_lengths"].items()})
    expected = {
        ("asyncspec:spec_decode_num_drafts_total", ()): sum(s["blocks"] for s in stats),
        ("asyncspec:spec_decode_num_draft_tokens_total", ()): sum(s["drafted"] for s in stats),
        ("asyncspec:spec_decode_num_accepted_tokens_total", ()): sum(s["accepted"] for s in stats),
        ("asyncspec:generation_tokens_total", ()): sum(len(s["token_ids"]) for s in stats),
        ("asyncspec:uplink_bytes_total", ()): sum(s["uplink_bytes"] for s in stats),
        ("asyncspec:downlink_bytes_total", ()): sum(s["downlink_bytes"] for s in stats),
        ("asyncspec:e2e_request_latency_seconds_count", ()): len(stats),
    }
    for position, blocks in accepted_per_position(lengths).items():
        expected[("asyncspec:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(position)),))] = blocks
    for mode in MODES:
        settled = sum(
            sum(s["corrections"]["topk"].values()) if mode == "topk" else s["corrections"][mode] for s in stats
        )
        expected[("asyncspec:corrections_total", (("mode", mode),))] = settled
    problems = [
        f"{key}: scraped {samples.get(key)}, expected {value}"
        for key, value in expected.items()
        if samples.get(key) != value
    ]
    per_position = total(samples, "asyncspec:spec_decode_num_accepted_tokens_per_pos_total")
    if per_position != samples.get(("asyncspec:spec_decode_num_accepted_tokens_total", ())):
        problems.append(f"the per-position counts sum to {per_position}, not to the accepted tokens")
    return problems


@pytest.fixture(scope="module")
def pair():
    return model_pair(noise=0.3)


@dataclass
class EdgeRun:
    client: TestClient  # the edge's HTTP app
    answers: list[dict]  # the completions' response bodies
    cloud_metrics_url: str
    closed: list[EdgeRequest]  # every request the gateway closed, in order
    gateway: EdgeGateway


@pytest.fixture(scope="module")
def edge_run(pair):
    """One run: COMPLETIONS through the edge's HTTP API, with the cloud's metrics served on loopback."""
    target, drafter = pair
    with services(target, drafter, policy=POLICY) as (gateway, cloud, _):
        closed: list[EdgeRequest] = []
        gateway.closed_observers.append(lambda request, completed: closed.append(request))
        client = TestClient(make_app(gateway, drafter.tokenizer, "tiny"))
        answers = [client.post("/v1/completions", json=body).json() for body in COMPLETIONS]
        assert wait_until(lambda: cloud.summary()["open_requests"] == 0, timeout_s=10)  # every Close arrived
        registry, port = new_registry(), free_port()
        register_cloud(registry, cloud)
        server = serve_metrics(registry, port)
        try:
            yield EdgeRun(client, answers, f"http://127.0.0.1:{port}/metrics", closed, gateway)
        finally:
            server.shutdown()


def test_the_edge_scrape_equals_the_requests_own_figures(edge_run):
    answers = edge_run.answers
    assert all("choices" in answer for answer in answers), answers
    response = edge_run.client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = scrape_text(response.text)
    assert edge_mismatches(samples, answers) == []
    assert samples[("asyncspec:spec_decode_num_drafts_total", ())] > 0
    assert total(samples, "asyncspec:corrections_total") > 0  # the sampled requests had rejections
    assert samples[("asyncspec:edge_completed_total", ())] == len(COMPLETIONS)
    assert samples[("asyncspec:num_requests_running", ())] == 0
    assert samples[("asyncspec:time_to_first_token_seconds_count", ())] == len(COMPLETIONS)


def test_a_request_counted_twice_fails_the_comparison(edge_run):
    """The negative control: metrics shown every closed request once agree with the answers; shown
    one of them a second time, the comparison must flag it."""
    answers, closed = edge_run.answers, edge_run.closed
    replay = EdgeMetrics(edge_run.gateway)  # counts only what it is shown here: the run has ended
    for request in closed:
        replay.observe(request, completed=True)
    assert edge_mismatches(scrape_text(generate_latest(replay.registry).decode()), answers) == []
    replay.observe(next(request for request in closed if request.stats.accepted), completed=True)
    problems = edge_mismatches(scrape_text(generate_latest(replay.registry).decode()), answers)
    assert any("spec_decode_num_drafts_total" in problem for problem in problems), problems
    assert any("spec_decode_num_accepted_tokens_total" in problem for problem in problems), problems


def test_the_cloud_scrape_equals_what_the_edge_saw(edge_run):
    answers = edge_run.answers
    with urllib.request.urlopen(edge_run.cloud_metrics_url, timeout=10) as response:
        samples = scrape_text(response.read().decode())
    accepted = sum(answer["asyncspec"]["accepted"] for answer in answers)
    assert samples[("asyncspec:cloud_accepted_total", ())] == accepted
    assert samples[("asyncspec:cloud_opens_total", ())] == samples[("asyncspec:cloud_closes_total", ())] == len(answers)
    assert samples[("asyncspec:cloud_batch_size_count", ())] == samples[("asyncspec:cloud_batches_total", ())]
    assert samples[("asyncspec:cloud_batch_size_sum", ())] == samples[("asyncspec:cloud_batched_blocks_total", ())]
    assert samples[("asyncspec:num_requests_running", ())] == samples[("asyncspec:kv_cache_reserved_bytes", ())] == 0
    assert total(samples, "asyncspec:cloud_traffic_received_bytes_total", message="Block") > 0
    assert total(samples, "asyncspec:invariance_selftest_passed") == 1


def test_the_cloud_metrics_server_answers_loopback_host_names_only(edge_run):
    cloud_url = edge_run.cloud_metrics_url
    request = urllib.request.Request(cloud_url, headers={"Host": "rebound.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    with pytest.raises(InputError, match="loopback only"):
        serve_metrics(new_registry(), free_port(), host="0.0.0.0")
    port = int(cloud_url.split(":")[2].split("/")[0])
    with pytest.raises(InputError, match="cannot serve metrics"):
        serve_metrics(new_registry(), port)  # busy: a clear error, not a traceback


def test_metrics_need_the_api_key_when_the_api_does(pair, edge_run):
    guarded = TestClient(make_app(edge_run.gateway, pair[1].tokenizer, "tiny", guard=GuardConfig(api_keys=(API_KEY,))))
    assert guarded.get("/metrics").status_code == 401
    assert guarded.get("/health").status_code == 401  # the same rule as /health
    assert guarded.get("/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


def _wav(seconds: float = 2.0) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, synthetic_speech(seconds), 16_000, format="WAV")
    return out.getvalue()


def test_the_listen_scrape_equals_the_answer():
    engine = make_engine(tiny_whisper(torch.float32, seed=2))
    client = TestClient(create_app(engine))
    answer = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav(), "audio/wav")}).json()
    figures = answer["asyncspec"]
    method = {"method": figures["method"]}
    samples = scrape_text(client.get("/metrics").text)
    assert samples[("asyncspec:listen_requests_completed_total", ())] == 1
    assert samples[("asyncspec:listen_requests_failed_total", ())] == 0
    assert total(samples, "asyncspec:listen_audio_seconds_total", **method) == pytest.approx(figures["audio_s"])
    assert total(samples, "asyncspec:listen_output_tokens_total", **method) == figures["n_tokens"]
    assert total(samples, "asyncspec:listen_fallbacks_total", **method) == figures["method_stats"]["fallbacks"]
    assert total(samples, "asyncspec:listen_e2e_request_latency_seconds_count", **method) == 1
    latency = total(samples, "asyncspec:listen_e2e_request_latency_seconds_sum", **method)
    assert latency == pytest.approx(figures["latency_s"])
    engine.close()


def test_serve_cloud_metrics_port(tmp_path):
    """The command line's wiring: `serve cloud --metrics-port` serves the verifier's figures."""
    target, _ = model_pair(noise=0.05, family="qwen3")
    model_dir, port = save_tiny(target, tmp_path / "target"), free_port()
    cloud = spawn(
        "serve", "cloud", "--model", str(model_dir), "--bind", free_address(), "--dtype", "fp32",
        "--metrics-port", str(port),
    )  # fmt: skip
    try:
        wait_ready(cloud)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            samples = scrape_text(response.read().decode())
    finally:
        returncode, log = stop_process(cloud)
    assert returncode == 0, log
    assert samples[("asyncspec:num_requests_running", ())] == 0
    assert total(samples, "asyncspec:invariance_selftest_passed", dtype="fp32") == 1
    assert samples[("asyncspec:kv_cache_budget_bytes", ())] > 0
