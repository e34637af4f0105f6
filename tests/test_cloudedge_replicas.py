"""`serve cloud --replicas N` (issue 25 §2-4): verifier replicas as Ray actors behind the ZeroMQ front.

Session-sticky routing keeps every greedy request equal to target-only; a replica killed mid-run
(SIGKILL of its process) loses nothing: its requests resync on the other replica, and the front
counts the death and the requests it orphaned. The controls: routing by frame instead of by request
is caught (the replicas answer blocks of requests they never opened with Nack "unknown"), and a
death whose requests are not resynchronised loses requests. Ray runs inside a network namespace
with only loopback (ray_netns.py). Ray is an optional extra: a plain `serve cloud` needs none, and
`--replicas` without it fails with an error that names the extra."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cloudedge_support import SRC, free_address, spawn, stop_process, wait_ready
from ray_netns import netns_problem, run_in_loopback_netns
from test_cloudedge_process import pair_dirs

assert pair_dirs  # the fixture: a tiny Qwen3 target and drafter, also saved as model directories
SCENARIOS = str(Path(__file__).resolve().parent / "replica_scenarios.py")


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    problem = netns_problem()
    if problem:
        pytest.skip(f"the replica scenarios need Ray in a loopback-only network namespace: {problem}")
    out = tmp_path_factory.mktemp("replicas") / "scenarios.json"
    done = run_in_loopback_netns([SCENARIOS, str(out)], timeout_s=400)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def _replica_nacks(report: dict, reason: str) -> int:
    return sum(r.get("cloud", {}).get("nacks", {}).get(reason, 0) for r in report["counters"]["replicas"])


def test_a_killed_replica_loses_nothing(scenarios):
    run = scenarios["resync"]
    assert "2 replicas on Ray" in run["ready"], run["ready"]
    assert run["first"] == scenarios["expected"]  # sticky routing over two replicas: every request as target-only
    # the kill came mid-run: every request had output, none had finished
    assert all(n > 1 for n in run["killed_at_events"]) and not any(run["finished_before_kill"]), run
    assert run["second"] == scenarios["expected_kill_round"], run["stderr_tail"]  # ... and each completes exactly
    front = run["counters"]["front"]
    assert front["replica_deaths"] == 1 and front["orphaned_requests"] >= 1, front
    assert front["resync_nacks"] + front["rerouted_opens"] >= 1 and front["dropped_frames"] == 0, front
    # the survivor and the replica Ray restarted answer; neither saw a block of a request it did not hold
    assert [r.get("error") for r in run["counters"]["replicas"]] == [None, None], run["counters"]["replicas"]
    assert _replica_nacks(run, "unknown") == 0
    # which replica took the orphans depends on the free KV bytes reported at the resync: either may
    # (the killed one is restarted by Ray with fresh counters), so no replica's own count is asserted


def test_control_routing_by_frame_is_caught(scenarios):
    run = scenarios["unsticky"]
    # blocks reach a replica that never opened their request: it answers "unknown", the edge resyncs
    assert _replica_nacks(run, "unknown") > 0, run["counters"]


def test_control_a_death_without_resync_loses_requests(scenarios):
    run = scenarios["no_resync"]
    assert run["first"] == scenarios["expected"]
    lost = [i for i, tokens in enumerate(run["second"]) if tokens != scenarios["expected_kill_round"][i]]
    assert lost, "a replica killed without resync lost no request: the test cannot tell"
    front = run["counters"]["front"]
    assert front["replica_deaths"] == 1 and front["dropped_frames"] >= 1 and front["retired_replicas"] == 1


@pytest.fixture(scope="module")
def no_ray(tmp_path_factory) -> dict:
    """An environment where `import ray` fails, as where the extra is not installed."""
    blocker = tmp_path_factory.mktemp("no-ray")
    (blocker / "ray.py").write_text("raise ImportError('ray is blocked for this test')\n")
    return {"PYTHONPATH": os.pathsep.join([str(blocker), SRC])}


def test_replicas_without_ray_name_the_extra_and_plain_serve_cloud_needs_none(pair_dirs, no_ray):
    _, _, target_dir, _ = pair_dirs
    args = ["serve", "cloud", "--model", str(target_dir), "--dtype", "fp32", "--bind", free_address()]
    replicas = spawn(*args, "--replicas", "2", env_extra=no_ray)
    replicas.stdout.close()
    code, stderr = replicas.wait(60), replicas.stderr.read()
    assert code == 2 and "asyncspec[ray]" in stderr, stderr
    plain = spawn(*args, env_extra=no_ray)
    try:
        assert "ready" in wait_ready(plain)
    finally:
        assert stop_process(plain)[0] == 0


def test_bench_cloud_replicas_are_a_variant_per_count():
    from asyncspec.benchmarks.cloud_load import parse_variants
    from asyncspec.errors import InputError

    assert parse_variants(None, "1,2") == {
        "replicas-1": ["--replicas", "1", "--replica-threads", "1"],
        "replicas-2": ["--replicas", "2", "--replica-threads", "1"],
    }
    assert list(parse_variants(["one=--max-stack 1"], "2")) == ["replicas-2", "one"]
    assert parse_variants(None) == {"as-is": []}
    with pytest.raises(InputError):
        parse_variants(None, "1,x")
