"""`asyncspec bench cloud`: traffic recorded from a real edge run is replayed against a real `serve
cloud` and every reply comes back as recorded; against another target (the control) they do not,
and the command fails."""

from __future__ import annotations

import json

from asyncspec.cli import main
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.traffic_log import TrafficRecording, load_recording, sessions_of
from cloudedge_support import run_requests, services, wait_until
from test_cloudedge_process import pair_dirs

assert pair_dirs  # the fixture: a tiny Qwen3 target and drafter, also saved as model directories

PROMPTS = [[3, 17, 5, 8], [9, 2, 44], [12, 13, 14, 15, 16], [7, 7, 1], [21, 40]]


def recorded_traffic(target, drafter, path, sampling: wire.Sampling) -> list[dict]:
    # no resubmission after 3 s of silence, as a loaded machine could cause: a plain exchange each
    policy = EdgePolicy(block_size=5, dead_after_s=120.0)
    with services(target, drafter, policy) as (gateway, cloud, _):
        cloud.traffic.recording = TrafficRecording()
        results = run_requests(gateway, PROMPTS, 20, sampling)
        # the edge closes a finished request after its client has the result: on a loaded machine
        # the last Close reached the cloud only after the services stopped ("never closed")
        assert wait_until(lambda: not cloud.requests and not cloud.opening, 30), "a request was never closed"
    cloud.traffic.recording.save(path)
    return results


def test_replayed_traffic_gets_the_recorded_replies_and_another_target_fails(pair_dirs, tmp_path):
    target, drafter, target_dir, drafter_dir = pair_dirs
    traffic = tmp_path / "traffic.msgpack"
    results = recorded_traffic(target, drafter, traffic, wire.Sampling(0.7, 5))  # sampled: corrections too
    sessions = sessions_of(load_recording(traffic))
    assert len(sessions.sessions) == len(PROMPTS) and not sessions.left_out, sessions.left_out
    blocks = sum(r["stats"]["blocks"] for r in results)
    argv = ["bench", "cloud", "--traffic", str(traffic), "--dtype", "fp32", "--concurrency", "3"]
    assert main([*argv, "--model", str(target_dir), "--out", str(tmp_path / "same")]) == 0
    variant = json.loads((tmp_path / "same" / "bench_cloud.json").read_text())["variants"][0]
    assert variant["verdicts"] == blocks and variant["mismatches"] == []
    assert variant["verified_tokens"] == sum(r["stats"]["accepted"] + r["stats"]["blocks"] for r in results)
    assert variant["verified_tokens_per_s"] > 0 and 0 < variant["busy_share"] <= 1
    # the control: the drafter as the cloud's target answers differently, and the command says so
    assert main([*argv, "--model", str(drafter_dir), "--out", str(tmp_path / "other")]) == 1
    other = json.loads((tmp_path / "other" / "bench_cloud.json").read_text())["variants"][0]
    assert other["mismatches"]
