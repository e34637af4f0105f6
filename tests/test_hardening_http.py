"""The edge's OpenAI API under hostile requests: each gets an OpenAI-style error, the edge keeps
serving, and a normal request afterwards is exact (equals target-only decoding)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from asyncspec.cloudedge.http import make_app
from asyncspec.httpguard import GuardConfig
from cloudedge_support import model_pair
from hardening_support import NORMAL_TOKENS, expected_tokens, live_services

NORMAL = {"prompt": "w3 w4 w5", "max_tokens": NORMAL_TOKENS, "temperature": 0}


@pytest.fixture(scope="module")
def pair():
    return model_pair(noise=0.3)


@pytest.fixture(scope="module")
def live(pair):
    target, drafter = pair
    with live_services(target, drafter) as services:
        yield services


@pytest.fixture(scope="module")
def client(live, pair):
    app = make_app(live.gateway, pair[1].tokenizer, "tiny", guard=GuardConfig(max_body_bytes=8192))
    return TestClient(app)


def assert_exact(client, pair) -> None:
    response = client.post("/v1/completions", json=NORMAL)
    assert response.status_code == 200, response.text
    tokens = pair[0].tokenizer.encode(response.json()["choices"][0]["text"])
    assert tokens == expected_tokens(pair[0])


HOSTILE_FIELDS = [
    {"temperature": 1e-45},  # the must-show payload: NaN probabilities in the drafter before
    {"temperature": 1e39},
    {"temperature": -1},
    {"temperature": "hot"},
    {"temperature": True},
    {"seed": -1},
    {"seed": 2**64},
    {"seed": 1.5},
    {"max_tokens": 0},
    {"max_tokens": 10**9},
    {"max_tokens": "5"},
    {"n": 2},
    {"best_of": 3},
    {"logprobs": 6},
    {"logprobs": 2, "stream": True},
    {"top_logprobs": 2},
    {"stop": ["a", "b", "c", "d", "e"]},
    {"stop": [1]},
    {"stop": "x" * 257},
    {"top_p": 0},
    {"presence_penalty": 3},
    {"frequency_penalty": -2.5},
    {"user": ["u"]},
    {"echo": True},
    {"logit_bias": {"5": 100}},
    {"eps_req": 2.0},
    {"stream": "yes"},
    {"prompt": ""},
    {"prompt": 42},
    {"prompt": ["a", "b"]},
]


@pytest.mark.parametrize("fields", HOSTILE_FIELDS, ids=lambda f: json.dumps(f)[:40])
def test_a_hostile_field_gets_an_openai_style_400_and_the_edge_goes_on(client, live, fields):
    response = client.post("/v1/completions", json={**NORMAL, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert live.alive()


def test_after_the_hostile_fields_a_normal_request_is_exact(client, pair):
    assert_exact(client, pair)


def test_the_documented_minimum_temperature_is_served(client):
    """0.01 rounds to 0.0099999998 in float32; the cloud checked that below 0.01 and the edge gave a 500."""
    for temperature in (0.01, 100):
        response = client.post("/v1/completions", json=NORMAL | {"temperature": temperature, "max_tokens": 3})
        assert response.status_code == 200, response.text
    assert client.post("/v1/completions", json=NORMAL | {"temperature": 0.0099}).status_code == 400  # control


@pytest.mark.parametrize(
    "body", [b"{", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"prompt": "w1", "max_tokens": NaN, "temperature": 0}']
)
def test_a_body_that_is_not_a_json_object_gets_a_400(client, body):
    response = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["message"]


def test_a_body_over_the_cap_gets_a_413_before_any_handler(client, pair):
    response = client.post("/v1/completions", json={**NORMAL, "prompt": "w1 " * 5000})
    assert response.status_code == 413 and "exceeds" in response.json()["error"]["message"]
    chunked = client.post("/v1/completions", content=iter([b"x" * 5000, b"y" * 5000]))  # no Content-Length
    assert chunked.status_code == 413
    assert_exact(client, pair)


def test_a_prompt_longer_than_the_models_positions_is_a_400(client, pair):
    prompt = " ".join(["w3"] * (pair[1].max_length + 5))
    response = client.post("/v1/completions", json={**NORMAL, "prompt": prompt})
    assert response.status_code == 400 and "positions" in response.json()["error"]["message"]


def test_chat_messages_are_checked(client):
    for messages in (None, [], [{"role": "user"}], [{"role": "user", "content": 5}], "hi"):
        response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        assert response.status_code == 400, messages


def test_an_api_key_is_required_when_set(live, pair):
    app = make_app(live.gateway, pair[1].tokenizer, "tiny", guard=GuardConfig(api_keys=("s3cret",)))
    client = TestClient(app)
    assert client.post("/v1/completions", json=NORMAL).status_code == 401
    wrong = client.post("/v1/completions", json=NORMAL, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    right = client.post("/v1/completions", json=NORMAL, headers={"Authorization": "Bearer s3cret"})
    assert right.status_code == 200


def test_a_foreign_host_header_is_refused_and_no_cors_headers_are_sent(live, pair):
    guard = GuardConfig(allowed_hosts=("127.0.0.1", "localhost"))
    client = TestClient(make_app(live.gateway, pair[1].tokenizer, "tiny", guard=guard), base_url="http://localhost")
    assert client.get("/v1/models").status_code == 200
    rebound = client.get("/v1/models", headers={"Host": "attacker.example"})
    assert rebound.status_code == 400
    preflight = client.options("/v1/completions", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in preflight.headers


def test_the_served_edge_refuses_oversized_headers(live, pair):
    """Headers are capped: 64 KiB at the connection guard (connguard.py) and 32 KiB in httpguard.Guard
    (h11's own cap misses headers that arrive at once), as `serve edge --http` serves."""
    import socket

    from hardening_support import served

    app = make_app(live.gateway, pair[1].tokenizer, "tiny")
    with served(app, 4) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            huge = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * (100 << 10) + b"\r\n\r\n"
            connection.sendall(huge)
            reply = connection.recv(4096)
        assert reply.startswith(b"HTTP/1.1 431")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert connection.recv(4096).startswith(b"HTTP/1.1 200")  # still serving
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            big = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: " + b"a" * (40 << 10) + b"\r\n\r\n"
            connection.sendall(big)  # within the guard's cap, beyond the middleware's
            assert connection.recv(4096).startswith(b"HTTP/1.1 431")


def test_an_overloaded_edge_answers_429_with_retry_after(pair):
    from asyncspec.cloudedge.policy import EdgePolicy

    with live_services(pair[0], pair[1], policy=EdgePolicy(block_size=4, max_waiting=0)) as services:
        client = TestClient(make_app(services.gateway, pair[1].tokenizer, "tiny"))
        response = client.post("/v1/completions", json=NORMAL)
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert "overloaded" in response.json()["error"]["message"]
