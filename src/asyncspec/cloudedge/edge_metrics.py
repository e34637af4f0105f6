"""The edge's Prometheus metrics (GET /metrics on its HTTP API).

Per-request figures come from each request's `RequestStats`, observed once, when the gateway closes
the request's books (the stats are final then, and the client has not yet heard the end, so a
scrape after a response already counts it); nothing is counted as it happens a second time. The
edge's events and its open requests are read from the gateway when scraped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import Counter, Histogram
from prometheus_client.core import Metric

from asyncspec.cloudedge.correction import MODES
from asyncspec.cloudedge.requests import EdgeRequest, RequestStats
from asyncspec.metrics import LATENCY_BUCKETS, PREFIX, ReadAtScrape, counter_families, gauge, new_registry

BYTES_PER_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)


def accepted_per_position(accepted_lengths: Mapping[int, int]) -> dict[int, int]:
    """vLLM's per-position acceptance from the blocks' accepted lengths ({accepted: blocks}): position
    i counts the blocks whose candidate i was accepted, i.e. those that accepted more than i (a
    verdict accepts a prefix). The positions sum to the accepted tokens."""
    longest = max((n for n, blocks in accepted_lengths.items() if blocks), default=0)
    return {i: sum(blocks for n, blocks in accepted_lengths.items() if n > i) for i in range(longest)}


def time_per_output_token(stats: RequestStats) -> float | None:
    """The mean time between committed tokens after the first (None with fewer than two)."""
    times = stats.token_times
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


class EdgeMetrics:
    """The edge gateway's registry; attaches itself to the gateway's closed-request observers."""

    def __init__(self, gateway):
        self.registry = new_registry()
        self._spec_decode_counters()
        self._traffic_counters()
        self._latency_histograms()
        self.registry.register(ReadAtScrape(lambda: self._read(gateway)))
        gateway.closed_observers.append(self.observe)

    def _counter(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Counter:
        return Counter(f"{PREFIX}{name}", documentation, list(labels), registry=self.registry)

    def _histogram(self, name: str, documentation: str, buckets=LATENCY_BUCKETS) -> Histogram:
        return Histogram(f"{PREFIX}{name}", documentation, buckets=buckets, registry=self.registry)

    def _spec_decode_counters(self) -> None:
        self.drafts = self._counter("spec_decode_num_drafts", "blocks of candidates the cloud verified")
        self.draft_tokens = self._counter("spec_decode_num_draft_tokens", "candidates the cloud verified")
        self.accepted_tokens = self._counter("spec_decode_num_accepted_tokens", "candidates the cloud accepted")
        self.accepted_per_pos = self._counter(
            "spec_decode_num_accepted_tokens_per_pos", "blocks whose candidate at this position held", ["position"]
        )
        self.corrections = self._counter("corrections", "sampled rejections settled, by correction mode", ["mode"])
        self.correction_rounds = self._counter(
            "correction_round_trips", "correction round trips beyond the verdict, by the mode that settled", ["mode"]
        )
        for mode in MODES:  # every mode present from the first scrape, at 0
            self.corrections.labels(mode)
            self.correction_rounds.labels(mode)

    def _traffic_counters(self) -> None:
        self.generation_tokens = self._counter("generation_tokens", "tokens committed to closed requests")
        self.uplink_bytes = self._counter("uplink_bytes", "bytes the edge sent the cloud for closed requests")
        self.downlink_bytes = self._counter("downlink_bytes", "bytes the cloud sent the edge for closed requests")
        self.uplink_per_token = self._histogram(
            "uplink_bytes_per_token", "a completed request's uplink bytes per token", BYTES_PER_TOKEN_BUCKETS
        )
        self.downlink_per_token = self._histogram(
            "downlink_bytes_per_token", "a completed request's downlink bytes per token", BYTES_PER_TOKEN_BUCKETS
        )

    def _latency_histograms(self) -> None:
        self.ttft = self._histogram("time_to_first_token_seconds", "submission to first committed token")
        self.tpot = self._histogram("time_per_output_token_seconds", "a request's mean time between its tokens")
        self.e2e = self._histogram("e2e_request_latency_seconds", "submission to the request's end")
        self.queue_time = self._histogram("request_queue_time_seconds", "submission to admission (Open sent)")

    def observe(self, request: EdgeRequest, completed: bool) -> None:
        """One closed request (completed, or failed: its drafts and bytes were spent all the same;
        latency and per-token figures only of completed ones)."""
        stats = request.stats
        self.drafts.inc(stats.blocks)
        self.draft_tokens.inc(stats.drafted)
        self.accepted_tokens.inc(stats.accepted)
        for position, blocks in accepted_per_position(stats.accepted_lengths).items():
            self.accepted_per_pos.labels(str(position)).inc(blocks)
        self._observe_corrections(stats)
        tokens = len(stats.token_times)
        self.generation_tokens.inc(tokens)
        self.uplink_bytes.inc(stats.uplink_bytes)
        self.downlink_bytes.inc(stats.downlink_bytes)
        if completed:
            self._observe_latencies(stats, tokens)

    def _observe_corrections(self, stats: RequestStats) -> None:
        counts = stats.corrections
        for mode in MODES:
            n = sum(counts.topk.values()) if mode == "topk" else getattr(counts, mode)  # topk: over every K
            self.corrections.labels(mode).inc(n)
            self.correction_rounds.labels(mode).inc(counts.rounds[mode])

    def _observe_latencies(self, stats: RequestStats, tokens: int) -> None:
        if stats.first_token is not None:
            self.ttft.observe(stats.first_token - stats.submitted)
        if (tpot := time_per_output_token(stats)) is not None:
            self.tpot.observe(tpot)
        if stats.finished is not None:
            self.e2e.observe(stats.finished - stats.submitted)
        if stats.started is not None:
            self.queue_time.observe(stats.started - stats.submitted)
        if tokens:
            self.uplink_per_token.observe(stats.uplink_bytes / tokens)
            self.downlink_per_token.observe(stats.downlink_bytes / tokens)

    @staticmethod
    def _read(gateway) -> list[Metric]:
        """At scrape time, from another thread: only reads that are atomic under the GIL (len of a
        dict, int fields), never iteration over the gateway's live requests."""
        labels = {"unattributed_nacks": "reason"}
        events = counter_families("edge_", gateway.events, labels, "cloudedge.edge_counters.EdgeEvents")
        return [
            *events,
            gauge("num_requests_running", "requests admitted and not yet closed", len(gateway.requests)),
            gauge("num_requests_waiting", "requests waiting for admission", len(gateway.waiting)),
        ]
