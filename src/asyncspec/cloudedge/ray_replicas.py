"""Starting the verifier replicas on Ray: an embedded local Ray instance (or a cluster joined by
address), and one actor per replica with its own engine, CPUs and restart budget. Ray is an
optional extra: without it, `--replicas` fails with an error that names it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from asyncspec.cloudedge.cloud_state import CloudConfig
from asyncspec.errors import InputError

RAY_MISSING = "--replicas runs the verifier replicas on Ray, which is not installed: pip install 'asyncspec[ray]'"


@dataclass(frozen=True)
class ReplicaPlan:
    replicas: int
    model: str
    dtype: str
    threads: int = 1  # each replica's torch threads, and the CPUs Ray reserves for it
    max_restarts: int = 3  # Ray restarts a dead replica this often (its requests resync elsewhere meanwhile)
    ray_address: str | None = None  # None: an embedded local Ray instance


def require_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise InputError(RAY_MISSING) from error
    return ray


def start_ray(plan: ReplicaPlan) -> bool:
    """Ray up (True: this process started it, so it stops it). The embedded instance binds loopback."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    if plan.ray_address:
        ray.init(address=plan.ray_address, log_to_driver=True)
        return True
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report off this machine
    cpus = max(plan.replicas * plan.threads, os.cpu_count() or 1)
    ray.init(num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=True)
    return True


def start_replicas(plan: ReplicaPlan, config: CloudConfig) -> list[Any]:
    """The replicas' actor handles, each created (its model loaded) before this returns."""
    ray = require_ray()
    from asyncspec.cloudedge.replica import Replica

    actor = ray.remote(Replica).options(num_cpus=plan.threads, max_restarts=plan.max_restarts, max_task_retries=0)
    handles = [actor.remote(plan.model, plan.dtype, plan.threads, config) for _ in range(plan.replicas)]
    ray.get([handle.describe.remote() for handle in handles])  # a model that fails to load fails here
    return handles


def stop_ray(started: bool) -> None:
    if started:
        require_ray().shutdown()
