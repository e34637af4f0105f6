"""The edge's scheduler without sockets or models: admission order and back-pressure, the open-block
rule with and without the pipeline, runahead's depth, and derived counters."""

from __future__ import annotations

import time

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.edge_counters import EdgeEvents, RequestTotals, snapshot
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import OpenBlock, new_request
from asyncspec.cloudedge.runahead import invalidate_ahead, may_run_ahead, presumption_held
from asyncspec.cloudedge.scheduler import EdgeScheduler

EOS = frozenset({0})


def request(limit: int = 50):
    made = new_request([5, 6, 7], limit, wire.Sampling(), 0.0, lambda event: None)
    made.limit = limit
    return made


def block(req, base: int, root: int, candidates: list[int]) -> OpenBlock:
    message = wire.Block(wire.BlockId(req.id, base, len(candidates), req.sampling.digest()), root, b"", b"", b"")
    return OpenBlock(message, candidates, None, time.monotonic())


def test_admission_is_in_arrival_order_with_back_pressure():
    scheduler = EdgeScheduler(EdgePolicy(max_active=2, max_waiting=3), EOS)
    requests = [request() for _ in range(4)]
    assert [scheduler.enqueue(r) for r in requests] == [True, True, True, False]  # the fourth is refused
    admitted = []
    for r in scheduler.admissible():  # as the gateway does: each admitted request becomes active
        scheduler.activate(r)
        admitted.append(r)
    assert admitted == requests[:2]  # two active at most
    assert list(scheduler.admissible()) == [] and list(scheduler.waiting) == [requests[2]]
    assert scheduler.find(requests[2].id) is requests[2] and scheduler.remove(requests[2]) is False
    assert scheduler.remove(requests[0]) is True and scheduler.find(requests[0].id) is None


def test_one_open_block_per_request_and_none_across_requests_without_the_pipeline():
    for pipeline in (True, False):
        scheduler = EdgeScheduler(EdgePolicy(pipeline=pipeline), EOS)
        first, second = request(), request()
        scheduler.activate(first)
        scheduler.activate(second)
        assert scheduler.next_draftable() is first
        first.open = block(first, 4, 7, [8, 9])
        assert not scheduler.draftable(first)  # its block is open: it drafts nothing more
        picked = scheduler.next_draftable()
        assert picked is (second if pipeline else None)  # stop-and-wait: nobody drafts while a block is open


def test_runahead_drafts_ahead_up_to_its_depth_and_a_wrong_presumption_invalidates():
    policy = EdgePolicy(pipeline=False, runahead=True, runahead_depth=2)
    scheduler = EdgeScheduler(policy, EOS)
    req = request()
    scheduler.activate(req)
    req.open = block(req, 4, 7, [8, 9])
    assert scheduler.draftable(req) and may_run_ahead(req, policy, EOS)
    req.ahead = [block(req, 7, 10, [11]), block(req, 9, 12, [13])]
    assert not scheduler.draftable(req)  # depth reached
    req.open.accepted = 2
    assert presumption_held(req, req.open, 10) and not presumption_held(req, req.open, 99)
    invalidate_ahead(req)
    assert req.ahead == [] and req.stats.invalidated_blocks == 2 and req.stats.invalidated_tokens == 4
    assert req.invalidated_bases == {7: 1, 9: 1}  # their Nacks are expected


def test_edge_totals_are_derived_from_request_stats():
    finished, active = RequestTotals(), request()
    done = request()
    done.stats.resyncs, done.stats.nacks["busy"], done.stats.max_open_blocks = 2, 3, 1
    finished.add(done.stats)
    active.stats.resyncs, active.stats.max_open_blocks = 1, 3
    events = EdgeEvents(submitted=2)
    events.unattributed_nacks["stale"] += 1
    counters = snapshot(events, finished, [active.stats])
    assert counters.resyncs == 3 and counters.max_open_blocks == 3 and counters.submitted == 2
    assert counters.nacks == {"busy": 3, "stale": 1}
    assert counters.as_dict()["nacks"] == {"busy": 3, "stale": 1}
    assert finished.resyncs == 2  # the snapshot did not fold the active request into the finished totals
