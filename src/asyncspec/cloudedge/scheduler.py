"""Which request the edge serves next: admission in arrival order up to `max_active`, the queue of
requests ready to draft, and the open-block rule (seed 002 §IV-C1: a request drafts only from its
confirmed prefix, so at most one of its blocks is open; without the pipeline at most one block is
open across all requests; only the runahead strategy drafts ahead). No sockets and no models:
tests drive it directly."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import EdgeRequest
from asyncspec.cloudedge.runahead import may_run_ahead


class EdgeScheduler:
    def __init__(self, policy: EdgePolicy, eos_ids: frozenset[int]):
        self.policy, self.eos_ids = policy, eos_ids
        self.waiting: deque[EdgeRequest] = deque()
        self.requests: dict[int, EdgeRequest] = {}  # admitted: drafting or verifying
        self.ready: deque[int] = deque()  # ids that may draft a block

    def enqueue(self, request: EdgeRequest) -> bool:
        """A submission waits its turn; False when the queue is full (back-pressure)."""
        if len(self.waiting) >= self.policy.max_waiting:
            return False
        self.waiting.append(request)
        return True

    def admissible(self) -> Iterator[EdgeRequest]:
        """Waiting requests, oldest first, while there is room among the active ones."""
        while self.waiting and len(self.requests) < self.policy.max_active:
            yield self.waiting.popleft()

    def activate(self, request: EdgeRequest) -> None:
        self.requests[request.id] = request
        self.ready.append(request.id)

    def find(self, request_id: int) -> EdgeRequest | None:
        return self.requests.get(request_id) or next((r for r in self.waiting if r.id == request_id), None)

    def remove(self, request: EdgeRequest) -> bool:
        """Forget a request wherever it is; whether it was active."""
        if request in self.waiting:
            self.waiting.remove(request)
        return self.requests.pop(request.id, None) is not None

    def busy(self) -> bool:
        """Any request active or waiting (cheap: the service loop asks every step)."""
        return bool(self.requests or self.waiting)

    def everyone(self) -> list[EdgeRequest]:
        return [*self.requests.values(), *self.waiting]

    def draftable(self, request: EdgeRequest | None) -> bool:
        """May this request draft a block now? From its confirmed prefix when nothing of it is open
        (and, without the pipeline, nothing of another request is open); ahead only under runahead."""
        if request is None:
            return False
        if request.open is None:
            return self.policy.pipeline or not any(r.open for r in self.requests.values())
        return may_run_ahead(request, self.policy, self.eos_ids)

    def next_draftable(self) -> EdgeRequest | None:
        for _ in range(len(self.ready)):
            request_id = self.ready.popleft()
            request = self.requests.get(request_id)
            if self.draftable(request):
                return request
            if request is not None and request.open is None:
                self.ready.append(request_id)  # waits for another request's block (no pipeline)
        return None

    def mark_ready(self, request: EdgeRequest) -> None:
        if request.id not in self.ready and self.draftable(request):
            self.ready.append(request.id)
