"""What every service's Prometheus metrics share: a registry per service (never prometheus_client's
global one: tests run several services in one process, and each must report only its own), figures
read from a service's existing counters at scrape time (nothing is counted a second time), the
invariance self-test's verdict, the /metrics route of the FastAPI services, and the cloud's own
metrics server on loopback.

Names follow vLLM's (`vllm:spec_decode_num_drafts` -> `asyncspec:spec_decode_num_drafts`), so a
dashboard built for vLLM reads the edge's speculative-decoding counters as they are."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from asyncspec.errors import InputError
from asyncspec.httpguard import allowed_hosts_for, host_name, is_loopback_host

PREFIX = "asyncspec:"
# seconds: a tiny model's token takes milliseconds, a 1.5B target's batch over a weak link seconds
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
SHARE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # a fraction in [0, 1]


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=False)


class ReadAtScrape(Collector):
    """A collector whose figures a function reads from the service when scraped."""

    def __init__(self, read: Callable[[], Iterable[Metric]]):
        self.read = read

    def collect(self) -> Iterable[Metric]:
        return list(self.read())


def counter_families(
    prefix: str, counters, labels: Mapping[str, str], source: str, skip: Iterable[str] = ()
) -> list[Metric]:
    """A dataclass of cumulative counts as Prometheus counters, one per field not in `skip`: numbers
    as they are (a `_s` field in seconds), a Counter field as one series per key under the label
    `labels[field]` (a Counter field `labels` leaves out is skipped). `source` names the dataclass
    in the help text, where each field's meaning is documented."""
    out: list[Metric] = []
    for field in fields(counters):
        if field.name in skip:
            continue
        value = getattr(counters, field.name)
        name = f"{PREFIX}{prefix}{field.name.removesuffix('_s')}"
        unit = "_seconds" if field.name.endswith("_s") else ""
        documentation = f"{source}.{field.name}"
        if isinstance(value, Counter):
            if field.name in labels:
                family = CounterMetricFamily(name, documentation, labels=[labels[field.name]])
                for key, count in sorted(dict(value).items(), key=str):  # dict(): one copy under the GIL
                    family.add_metric([str(key)], count)
                out.append(family)
        elif isinstance(value, int | float):
            out.append(CounterMetricFamily(name + unit, documentation, value=value))
    return out


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}{name}", documentation, value=value)


def histogram_of_counts(name: str, documentation: str, counts: Mapping[int, int], bounds: Iterable[int]) -> Metric:
    """A histogram from an existing count per integer value (e.g. the cloud's batch sizes)."""
    counts = dict(counts)
    buckets = [(str(bound), sum(n for value, n in counts.items() if value <= bound)) for bound in bounds]
    buckets.append(("+Inf", sum(counts.values())))
    total = sum(value * n for value, n in counts.items())
    return HistogramMetricFamily(f"{PREFIX}{name}", documentation, buckets=buckets, sum_value=total)


def selftest_families(backend) -> list[Metric]:
    """The invariance self-test's verdict on `backend` (1 passed, 0 failed), labelled with what it
    was measured for; nothing when the backend was never checked (the edge's drafter)."""
    report = getattr(backend, "invariance", None)
    if report is None:
        return []
    labels = ["engine", "dtype", "threads"]
    family = GaugeMetricFamily(
        f"{PREFIX}invariance_selftest_passed", "the target's invariance self-test: 1 passed", labels=labels
    )
    family.add_metric([report.engine, report.dtype, str(report.threads)], int(report.passed))
    return [family]


def add_metrics_route(app, registry: CollectorRegistry) -> None:
    """GET /metrics on a FastAPI app. It sits behind the app's httpguard.Guard, like /health: with
    API keys configured a scrape needs one too (Guard exempts no path, so neither does this)."""
    from fastapi.responses import Response

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # a scrape every few seconds must not fill the log
        pass


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> WSGIServer:
    """prometheus_client's exposition on host:port in a daemon thread, for a service without an HTTP
    API (the cloud). Loopback only: the metrics server has no API key, so off loopback it would
    answer anyone who reaches it (docs/hardening.md); a remote Prometheus scrapes through a tunnel or
    a local agent. Host names other than the loopback ones are refused (DNS rebinding)."""
    if not is_loopback_host(host):
        raise InputError(f"the metrics server binds to loopback only, not {host} (it has no authentication)")
    if not 0 < port < 65536:
        raise InputError(f"--metrics-port must be in 1..65535, got {port}")
    app = _loopback_hosts_only(make_wsgi_app(registry), allowed_hosts_for(host))
    try:
        server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    except OSError as error:
        raise InputError(f"cannot serve metrics on {host}:{port}: {error.strerror or error}") from None
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def _loopback_hosts_only(app, hosts: tuple[str, ...]):
    def checked(environ, start_response):
        if host_name(environ.get("HTTP_HOST", "")).lower() not in hosts:
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [b"the Host header is not one this service answers to\n"]
        return app(environ, start_response)

    return checked
