"""Keeping the edge's link to the cloud alive: heartbeats, the judgement that the cloud is silent
or gone, retransmission of what a live cloud has not answered, and resynchronisation (the cloud is
told the confirmed prefix again, then the open block is resent: idempotent by block id).

Pings go out only after `heartbeat_s` without a word from the cloud (verdicts and corrections are
proof of life too). The cloud is judged by how long its oldest unanswered ping stays unanswered
*after the socket was drained*, so an edge that was itself busy (drafting, admitting many
requests) does not mistake its own pause for a dead cloud. Silence beyond `dead_after_s` with work
outstanding reconnects and resubmits; beyond `give_up_s` the outstanding requests fail.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.requests import CloudInfo, EdgeRequest
from asyncspec.cloudedge.runahead import invalidate_ahead

if TYPE_CHECKING:
    from asyncspec.cloudedge.edge import EdgeGateway


class Liveness:
    def __init__(self, gateway: EdgeGateway):
        self.gateway = gateway
        self.policy = gateway.policy
        self.last_heard = time.monotonic()
        self.last_ping = 0.0
        self.unanswered_since: float | None = None  # the first ping not yet followed by any message

    def heard(self) -> None:
        self.last_heard = time.monotonic()
        self.unanswered_since = None

    def check(self) -> None:
        """Called right after the socket was drained: an unanswered ping is real silence."""
        gateway, now = self.gateway, time.monotonic()
        quiet = gateway.cloud is None or now - self.last_heard >= self.policy.heartbeat_s
        if quiet and now - self.last_ping >= self.policy.heartbeat_s:
            self._ping(now)
        if not gateway.scheduler.busy() or self.unanswered_since is None:
            return
        silence = now - self.unanswered_since
        if now - self.last_heard > self.policy.give_up_s and silence > self.policy.dead_after_s:
            reason = f"the cloud at {gateway.cloud_address} did not answer for {now - self.last_heard:.0f} s"
            for request in gateway.scheduler.everyone():
                gateway.fail(request, reason)
            return
        if silence > self.policy.dead_after_s:
            gateway.events.cloud_lost += 1
            gateway.connect()  # a fresh socket: nothing queued for a dead peer survives
            self.unanswered_since = None
            self._ping(now)
            self.resubmit_all()

    def _ping(self, now: float) -> None:
        self.last_ping = now
        self.gateway.send(wire.Ping(now))
        if self.unanswered_since is None:
            self.unanswered_since = now

    def retransmit(self) -> None:
        """Resend what a live cloud has not answered: a block after a busy back-off, or any block
        or correction query unanswered for dead_after_s (a lost frame; idempotent by block id)."""
        now = time.monotonic()
        for request in list(self.gateway.scheduler.requests.values()):
            block = request.open
            if block is None:
                continue
            busy_over = block.retry_at is not None and now >= block.retry_at
            if not busy_over and now - block.sent_at <= self.policy.dead_after_s:
                continue
            block.retry_at, block.sent_at = None, now
            request.stats.resubmits += 1
            if block.asked is not None:
                asked = block.asked
                self.gateway.send(wire.CorrectionQuery(block.id, asked.kind, asked.start, asked.stop), request)
            elif block.accepted is None:
                self.gateway.send(block.message, request)

    def resync(self, request: EdgeRequest) -> None:
        """Tell the cloud the confirmed prefix again, then resend the open block (same id)."""
        request.stats.resyncs += 1
        if request.stats.resyncs > self.policy.max_resyncs:
            self.gateway.fail(request, "the cloud kept losing this request's state")
            return
        request.epoch += 1
        invalidate_ahead(request)
        self.gateway.send(self.gateway.open_message(request), request)
        block = request.open
        if block is not None:
            block.accepted, block.session, block.asked, block.retry_at = None, None, None, None
            block.sent_at = time.monotonic()
            request.stats.resubmits += 1
            self.gateway.send(block.message, request)

    def resubmit_all(self) -> None:
        for request in list(self.gateway.scheduler.requests.values()):
            self.resync(request)

    def pong(self, pong: wire.Pong) -> None:
        """The cloud's answer to a ping: its vocabulary must be the drafter's; a new instance (a
        restarted cloud) has lost every request's state, so all are resubmitted."""
        gateway = self.gateway
        if pong.vocab_size != gateway.drafter.vocab_size:
            gateway.fatal = (
                f"the cloud's vocabulary ({pong.vocab_size}) differs from the drafter's ({gateway.drafter.vocab_size})"
            )
            for request in list(gateway.requests.values()):
                gateway.fail(request, gateway.fatal)
            return
        restarted = gateway.cloud is not None and pong.instance != gateway.cloud.instance
        gateway.cloud = CloudInfo(pong.instance, pong.vocab_size, pong.max_length)
        if restarted:
            gateway.events.cloud_restarts += 1
            self.resubmit_all()

    def nack(self, request: EdgeRequest | None, nack: wire.Nack) -> None:
        """The cloud could not serve a block: back off (busy), resynchronise (stale, unknown), or
        fail the request (invalid, or refused at its Open)."""
        gateway = self.gateway
        if request is None:
            gateway.events.unattributed_nacks[nack.reason] += 1
            return
        request.stats.nacks[nack.reason] += 1
        if nack.reason == "full":  # refused at its Open, whatever block is open: retrying would loop
            reason = nack.detail or "it holds its limit of requests"
            gateway.fail(request, f"the cloud refused the request: {reason}", capacity=True)
            return
        if request.invalidated_bases[nack.base] > 0 and nack.reason in ("stale", "unknown"):
            request.invalidated_bases[nack.base] -= 1  # the answer to a runahead block already discarded
            return
        base = len(request.prompt) + len(request.generated)
        if request.open is None or nack.base != base:
            return  # about a block that is no longer open
        if nack.reason == "busy":
            request.open.retry_at = time.monotonic() + self.policy.busy_retry_s
        elif nack.reason == "invalid":
            detail = f": {nack.detail}" if nack.detail else ""
            gateway.fail(request, f"the cloud rejected the request as invalid{detail}")
        else:
            self.resync(request)
