"""`asyncspec serve cloud --replicas N`: the ZeroMQ front over N verifier replicas on Ray."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from asyncspec.errors import InputError


def run_replicas(args, config, curve, stop_flag) -> int:
    """`stop_flag`: what makes the stop flag (after Ray starts, as ray.init installs its own SIGTERM handler)."""
    import zmq

    from asyncspec.cloudedge.ray_replicas import ReplicaPlan, require_ray, start_ray, start_replicas, stop_ray
    from asyncspec.cloudedge.replicas import FrontConfig, ReplicaFront
    from asyncspec.cloudedge.traffic_log import TrafficRecording

    if args.replicas < 1 or args.replica_threads < 1 or args.replica_restarts < 0:
        raise InputError("--replicas and --replica-threads must be at least 1, --replica-restarts at least 0")
    if args.metrics_port is not None:
        raise InputError("--metrics-port is not served with --replicas (each replica's counters: the exit summary)")
    ray = require_ray()  # before anything starts: without the extra, the error names it
    plan = ReplicaPlan(
        args.replicas, args.model, args.dtype, args.replica_threads, args.replica_restarts, args.ray_address
    )
    started = start_ray(plan)
    summaries: list[dict] = []
    front = None
    try:
        stop = stop_flag()
        actors = start_replicas(plan, config)
        described = ray.get([actor.describe.remote() for actor in actors])
        free = ray.get(actors[0].step.remote([]))["free_kv"]
        front_config = FrontConfig(
            config.max_message_bytes,
            config.max_block,
            sticky=not args.unsticky_routing,
            resync_on_death=not args.no_resync_on_death,
        )
        front = ReplicaFront(actors, described[0] | {"free_kv": free}, front_config)
        front.traffic.recording = TrafficRecording() if args.record_traffic else None
        pids = ", ".join(str(d["pid"]) for d in described)
        secured = " (CURVE)" if curve else ""
        ready = (
            f"asyncspec cloud ready on {args.bind}{secured} (model {args.model}; {plan.replicas} replicas on Ray, "
            f"pids {pids}; {described[0]['batching']})"
        )
        try:
            front.serve(args.bind, stop, lambda: print(ready, flush=True), curve)
        except zmq.ZMQError as error:
            raise InputError(f"cannot bind {args.bind}: {error}") from error
        summaries = _summaries(ray, actors)
    finally:
        if front is not None:
            summary = json.dumps(front.summary(summaries), default=str)
            print(f"asyncspec cloud stopped; counters: {summary}", file=sys.stderr, flush=True)
            if front.traffic.recording is not None:
                front.traffic.recording.save(Path(args.record_traffic))
        stop_ray(started)
    return 0


def _summaries(ray, actors, wait_s: float = 60.0) -> list[dict]:
    """Each replica's counters (one Ray is still restarting: waited for; a dead one's: an error line)."""
    deadline = time.monotonic() + wait_s
    out = []
    for index, actor in enumerate(actors):
        while True:
            try:
                out.append(ray.get(actor.summary.remote(), timeout=max(1.0, deadline - time.monotonic())))
                break
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                out.append({"replica": index, "error": "still restarting at exit"})
                break
            except Exception as error:
                out.append({"replica": index, "error": f"{type(error).__name__}: {error}"[:300]})
                break
    return out
