"""The cloud verifier's Prometheus metrics (`serve cloud --metrics-port PORT`, on loopback).

Everything is read at scrape time from what the verifier already counts (`CloudCounters`, its
traffic counters, its quota), so nothing is counted twice and the serving loop does no extra work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from asyncspec.metrics import (
    ReadAtScrape,
    counter_families,
    gauge,
    histogram_of_counts,
    new_registry,
    selftest_families,
    serve_metrics,
)

BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
COUNTER_LABELS = {"nacks": "reason", "corrections": "kind"}  # batch_sizes: the histogram below
TRAFFIC_LABELS = {name: "message" for name in ("sent_bytes", "received_bytes", "sent_messages", "received_messages")}
PER_PEER_OR_REQUEST = ("per_peer_received", "per_request_sent", "per_request_received")  # unbounded label sets


def serve_cloud_metrics(port: int | None) -> Callable[[Any], None]:
    """`serve cloud --metrics-port PORT`: the metrics server on loopback (metrics.serve_metrics says
    why loopback only), started before the model loads; returns what registers the verifier."""
    if port is None:
        return lambda cloud: None
    registry = new_registry()
    serve_metrics(registry, port)
    return lambda cloud: register_cloud(registry, cloud)


def register_cloud(registry: CollectorRegistry, cloud) -> None:
    """The verifier's figures in `registry`, read whenever it is scraped."""
    registry.register(ReadAtScrape(lambda: read_cloud(cloud)))


def read_cloud(cloud) -> list[Metric]:
    """From another thread than the verifier's loop: int fields and one-copy dict() snapshots only."""
    counters, traffic = cloud.counters, cloud.traffic  # the verifier's loop keeps them
    figures = counter_families(
        "cloud_", counters, COUNTER_LABELS, "cloudedge.cloud_state.CloudCounters", skip=("largest_batch",)
    )
    batch_sizes = histogram_of_counts(
        "cloud_batch_size", "blocks per verification batch", counters.batch_sizes, BATCH_SIZE_BOUNDS
    )
    traffic_figures = counter_families(
        "cloud_traffic_", traffic, TRAFFIC_LABELS, "cloudedge.transport.TrafficCounters", skip=PER_PEER_OR_REQUEST
    )
    kv_budget = cloud.quota.kv_budget
    return [
        *figures,
        batch_sizes,
        *traffic_figures,
        gauge("cloud_largest_batch", "the most blocks one batch has held", counters.largest_batch),
        gauge("num_requests_running", "requests open at the cloud (KV held or prefill pending)", _open(cloud)),
        gauge("kv_cache_reserved_bytes", "KV memory the open requests reserve", cloud.quota.kv_reserved),
        *([gauge("kv_cache_budget_bytes", "KV memory the open requests may reserve", kv_budget)] if kv_budget else []),
        *selftest_families(cloud.target),
    ]


def _open(cloud) -> int:
    return len(cloud.requests) + len(cloud.opening)
