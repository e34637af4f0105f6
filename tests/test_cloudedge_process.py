"""The services as real processes (`asyncspec serve cloud|edge`, `asyncspec client`), the
OpenAI-compatible HTTP API through the official client, and a cloud killed and restarted
mid-run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.edge import EdgeGateway
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.base import DecodeRequest
from cloudedge_support import (
    SRC,
    Collector,
    ServiceThread,
    free_address,
    free_port,
    model_pair,
    run_requests,
    save_tiny,
    spawn,
    stop_process,
    wait_ready,
)

PROMPT = "w3 w17 w5 w8"


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    target, drafter = model_pair(noise=0.05, family="qwen3")
    root = tmp_path_factory.mktemp("tiny")
    return target, drafter, save_tiny(target, root / "target"), save_tiny(drafter, root / "drafter")


def _reference(model_dir, text: str, max_new_tokens: int) -> str:
    """What `asyncspec generate --model DIR --prompt TEXT --dtype fp32` prints (target-only greedy)."""
    from asyncspec.models.registry import load_decoder

    target = load_decoder(str(model_dir), "fp32")
    request = target.request(text, max_new_tokens=max_new_tokens)
    return target.tokenizer.decode(decode_target_only(target, None, request).tokens)


def test_serve_cloud_edge_client_and_openai_api(pair_dirs):
    from openai import OpenAI

    _, _, target_dir, drafter_dir = pair_dirs
    cloud_address, edge_address, port = free_address(), free_address(), free_port()
    cloud = spawn("serve", "cloud", "--model", str(target_dir), "--bind", cloud_address, "--dtype", "fp32")
    edge = spawn(
        "serve", "edge", "--model", str(drafter_dir), "--cloud", cloud_address, "--bind", edge_address,
        "--http", f"127.0.0.1:{port}", "--dtype", "fp32", "--block-size", "5",
    )  # fmt: skip
    try:
        ready = wait_ready(cloud)  # the batching mode and why: the self-test's batch check passed here
        assert "ready" in ready and "batching stacked: self-test batch check passed" in ready, ready
        assert "ready" in wait_ready(edge)
        expected = _reference(target_dir, PROMPT, 24)

        command = subprocess.run(
            [sys.executable, "-m", "asyncspec", "client", "--edge", edge_address, "--prompt", PROMPT,
             "--max-new-tokens", "24"],
            capture_output=True, text=True, timeout=120, env={"PYTHONPATH": SRC},
        )  # fmt: skip
        assert command.returncode == 0 and "24 tokens" in command.stderr, command.stderr
        assert command.stdout.strip() == expected  # streamed text

        api = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        completion = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
        assert completion.choices[0].text == expected
        streamed = "".join(
            chunk.choices[0].text
            for chunk in api.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
        )
        assert streamed == expected
        chat = api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "w1 w2"}], max_tokens=8, temperature=0
        )
        assert chat.choices[0].message.role == "assistant"
        pieces = [
            chunk.choices[0].delta.content or ""
            for chunk in api.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "w1 w2"}], max_tokens=8, temperature=0, stream=True
            )
        ]
        assert "".join(pieces) == chat.choices[0].message.content
        sampled = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=3)
        assert sampled.usage.completion_tokens >= 1
    finally:
        edge_rc, edge_log = stop_process(edge)
        cloud_rc, cloud_log = stop_process(cloud)
    assert edge_rc == 0 and "counters" in edge_log, edge_log
    assert cloud_rc == 0 and "counters" in cloud_log, cloud_log
    assert '"batches"' in cloud_log and '"mode": "stacked"' in cloud_log


def test_cloud_killed_and_restarted_mid_run(pair_dirs):
    target, drafter, target_dir, _ = pair_dirs
    address = free_address()
    args = ("serve", "cloud", "--model", str(target_dir), "--bind", address, "--dtype", "fp32")
    cloud = spawn(*args)
    wait_ready(cloud)
    policy = EdgePolicy(block_size=4, dead_after_s=1.0, heartbeat_s=0.2, give_up_s=60)
    gateway = EdgeGateway(drafter, address, policy)
    edge = ServiceThread(gateway).start()
    generator = torch.Generator().manual_seed(5)
    prompts = [
        torch.randint(0, 95, (int(k),), generator=generator).tolist()
        for k in torch.randint(1, 9, (12,), generator=generator)
    ]
    lengths = [60] * 12
    try:
        collectors = [Collector() for _ in prompts]
        for prompt, collector in zip(prompts, collectors, strict=True):
            gateway.submit(prompt, 60, wire.Sampling(), 0.0, collector)
        deadline = time.monotonic() + 60
        while sum(len(c.events) for c in collectors) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        cloud.kill()  # SIGKILL: no goodbye
        cloud.wait()
        committed_at_kill = sum(len(c.events) for c in collectors)
        time.sleep(1.5)
        cloud = spawn(*args)
        wait_ready(cloud)
        for collector in collectors:
            assert collector.done.wait(120), "a request hung after the restart"
        results = [c.result for c in collectors]
    finally:
        edge.close()
        cloud.send_signal(signal.SIGTERM)
        cloud.communicate(timeout=30)
    assert committed_at_kill < sum(len(r["tokens"]) for r in results)  # the kill was mid-run
    for prompt, limit, result in zip(prompts, lengths, results, strict=True):
        reference = decode_target_only(target, None, DecodeRequest(tuple(prompt), max_new_tokens=limit))
        assert result["type"] == "done" and result["tokens"] == reference.tokens
    counters = gateway.counters
    assert counters.cloud_lost + counters.cloud_restarts >= 1
    assert counters.resyncs >= 1


def test_edge_without_cloud_fails_requests_with_a_clear_error(pair_dirs):
    _, drafter, _, _ = pair_dirs
    gateway = EdgeGateway(drafter, free_address(), EdgePolicy(give_up_s=1.0, heartbeat_s=0.1))
    edge = ServiceThread(gateway).start()
    try:
        (result,) = run_requests(gateway, [[1, 2, 3]], 5, timeout=20)
    finally:
        edge.close()
    assert result["type"] == "error" and "did not answer" in result["message"]


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "edge", "--k-schedule", "64,16"],
        ["serve", "edge", "--k-schedule", "a,b"],
        ["serve", "cloud", "--model", "no-such-model"],
        ["client", "--prompt", "   "],
    ],
)
def test_bad_service_input_exits_2(argv, capsys):
    from asyncspec.cli import main

    assert main(argv) == 2
    assert "asyncspec: error:" in capsys.readouterr().err
