"""`listen`'s Prometheus metrics (GET /metrics on its HTTP port).

Each answered request's figures come from its `Response` (the figures its client receives under
`asyncspec`), observed once by the engine's worker before the client can read the answer; the
request counts (accepted, completed, failed, ...) and the queue are read from the engine when
scraped, from the counters it already keeps.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram
from prometheus_client.core import Metric

from asyncspec.metrics import (
    LATENCY_BUCKETS,
    PREFIX,
    SHARE_BUCKETS,
    ReadAtScrape,
    counter_families,
    gauge,
    new_registry,
    selftest_families,
)
from asyncspec.ondemand.engine import Engine
from asyncspec.ondemand.engine import Response as Transcription


class ListenMetrics:
    """The service's registry; attaches itself to the engine's answered-request observers."""

    def __init__(self, engine: Engine):
        self.registry = new_registry()
        registry = self.registry

        def counter(name: str, documentation: str) -> Counter:
            return Counter(f"{PREFIX}listen_{name}", documentation, ["method"], registry=registry)

        def histogram(name: str, documentation: str, buckets=LATENCY_BUCKETS) -> Histogram:
            return Histogram(f"{PREFIX}listen_{name}", documentation, ["method"], buckets=buckets, registry=registry)

        self.audio_seconds = counter("audio_seconds", "seconds of audio in answered requests")
        self.output_tokens = counter("output_tokens", "tokens in answered requests' transcripts")
        self.draft_tokens = counter("draft_tokens", "drafted tokens the target verified")
        self.accepted_tokens = counter("accepted_tokens", "drafted tokens the target accepted")
        self.fallbacks = counter("fallbacks", "windows decoded again at a higher temperature (uploads)")
        self.producer_failures = counter("producer_failures", "windows As²d's producer failed on (decoded target-only)")
        self.coverage = histogram("coverage", "a request's share of tokens that came from drafts", SHARE_BUCKETS)
        self.k1_share = histogram("k1_share", "a request's share of target calls verifying one token", SHARE_BUCKETS)
        self.latency = histogram("e2e_request_latency_seconds", "a request's arrival to its complete answer")
        self.queue_time = histogram("request_queue_time_seconds", "a request's arrival to its decoding's start")
        registry.register(ReadAtScrape(lambda: self._read(engine)))
        engine.response_observers.append(self.observe)

    def observe(self, response: Transcription) -> None:
        method, figures = response.method, response.method_stats
        self.audio_seconds.labels(method).inc(response.audio_s)
        self.output_tokens.labels(method).inc(len(response.tokens))
        self.draft_tokens.labels(method).inc(figures.get("drafted", 0))
        self.accepted_tokens.labels(method).inc(figures.get("accepted", 0))
        self.fallbacks.labels(method).inc(figures.get("fallbacks", 0))
        self.producer_failures.labels(method).inc(figures.get("producer_failures", 0))
        self.latency.labels(method).observe(response.latency_s)
        self.queue_time.labels(method).observe(response.queue_wait_s)
        if figures.get("drafted"):  # target-only requests draft nothing: no share to observe
            self.coverage.labels(method).observe(figures["coverage"])
            self.k1_share.labels(method).observe(figures["k1_share"])

    @staticmethod
    def _read(engine: Engine) -> list[Metric]:
        requests = counter_families("listen_requests_", engine.counters, {}, "ondemand.engine.EngineCounters")
        return [
            *requests,
            gauge("listen_requests_waiting", "requests queued for the decoding worker", engine.queue.qsize()),
            gauge("listen_busy", "1 while the worker decodes a request", int(engine.busy)),
            *selftest_families(engine.target),
        ]
