"""Health endpoints for orchestration: /health answers while the process serves; /ready says
whether a request can be served now (the edge: its cloud verifier introduced itself and is not
silent; listen: its decoding worker runs), and says why not with a 503."""

from __future__ import annotations

import time

import torch
from fastapi.testclient import TestClient

from asyncspec.cloudedge.http import make_app
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.ondemand.service import create_app
from cloudedge_support import model_pair, wait_until
from conftest import tiny_whisper
from hardening_support import live_services
from ondemand_helpers import make_engine

QUICK = EdgePolicy(heartbeat_s=0.2, dead_after_s=0.5, give_up_s=5.0)


def test_the_edge_is_ready_with_its_cloud_and_not_once_the_cloud_is_gone():
    target, drafter = model_pair(noise=0.3)
    with live_services(target, drafter, policy=QUICK) as live:
        client = TestClient(make_app(live.gateway, drafter.tokenizer, "tiny"))
        assert client.get("/health").json() == {"status": "ok"}
        assert wait_until(lambda: client.get("/ready").status_code == 200), client.get("/ready").json()
        assert client.get("/ready").json()["problems"] == []
        live.cloud_thread.close()  # the verifier stops answering
        assert wait_until(lambda: client.get("/ready").status_code == 503, timeout_s=10)
        problems = client.get("/ready").json()["problems"]
        assert problems and "cloud verifier" in problems[0], problems
        assert client.get("/health").status_code == 200  # alive, only not ready


def test_listen_is_ready_while_its_worker_runs():
    engine = make_engine(tiny_whisper(torch.float32, seed=2))
    client = TestClient(create_app(engine))
    assert client.get("/health").json() == {"status": "ok"} and client.get("/ready").status_code == 200
    engine.close()
    deadline = time.monotonic() + 10
    while engine.thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.get("/ready").status_code == 503 and client.get("/ready").json()["status"] == "not ready"
