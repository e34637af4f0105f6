"""The edge gateway: holds the drafter, the requests and their confirmed prefixes; drafts blocks
only from confirmed prefixes, keeps at most one open block per request (seed 002 §IV-C1) and,
while a block waits for the cloud, drafts for another ready request.

One thread runs `serve`: it owns the cloud DEALER socket and the optional client ROUTER socket.
Other threads (HTTP handlers) hand work in through `submit`, which is thread-safe.

The gateway wires the parts together: which request drafts next is `scheduler.py`'s, building a
block is `drafting.py`'s, the runahead baseline is `runahead.py`'s, heartbeats, retransmission and
resynchronisation are `liveness.py`'s, and correcting a sampled rejection is `correction.py`'s.
What stays here: the socket, admission, the replies (verdict, correction, Nack) and the commit.
A Pong from a new cloud instance or a Nack("unknown") resynchronises; nothing hangs.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

import zmq

from asyncspec.cloudedge import logprobs, validation
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.auth import CurveKeys, connection_id
from asyncspec.cloudedge.correction import Ask, Decided
from asyncspec.cloudedge.drafting import draft_block
from asyncspec.cloudedge.edge_corrections import answers_query, apply_answer, open_session, settled_in_verdict
from asyncspec.cloudedge.edge_counters import EdgeCounters, EdgeEvents, RequestTotals, snapshot
from asyncspec.cloudedge.limits import DEFAULT_MAX_MESSAGE_BYTES
from asyncspec.cloudedge.liveness import Liveness
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import (
    NO_OPTIONS,
    CloudInfo,
    DoneEvent,
    EdgeRequest,
    Emit,
    ErrorEvent,
    OpenBlock,
    checked_verdict,
    commit,
    new_request,
)
from asyncspec.cloudedge.runahead import invalidate_ahead, presumption_held
from asyncspec.cloudedge.scheduler import EdgeScheduler
from asyncspec.cloudedge.transport import Channel, TrafficCounters, make_socket
from asyncspec.decoding.drafter import PrefixDrafter
from asyncspec.models.base import Decoder, DecodeRequest


class EdgeGateway:
    def __init__(
        self,
        drafter: Decoder,
        cloud_address: str,
        policy: EdgePolicy | None = None,
        curve: CurveKeys | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self.drafter = drafter
        self.cloud_address = cloud_address
        self.curve = curve  # this edge's CURVE keys and the cloud's public key (None: plain TCP)
        self.max_message_bytes = max_message_bytes
        self.connection_id = connection_id()  # owns this edge's requests at the cloud, across reconnections
        self.policy = policy or EdgePolicy()
        self.inbox: queue.Queue = queue.Queue()
        self.cancellations: queue.Queue = queue.Queue()  # request ids whose clients went away
        self.scheduler = EdgeScheduler(self.policy, drafter.eos_ids)
        self.events = EdgeEvents()
        self.finished_totals = RequestTotals()  # the stats of every request that has ended
        self.closed_observers: list[Callable[[EdgeRequest, bool], None]] = []  # (request, completed): metrics
        self.traffic = TrafficCounters()
        self.cloud: CloudInfo | None = None
        self.channel: Channel | None = None
        self.context: zmq.Context = zmq.Context.instance()
        self.liveness = Liveness(self)
        self.fatal: str | None = None

    @property
    def requests(self) -> dict[int, EdgeRequest]:
        return self.scheduler.requests

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def counters(self) -> EdgeCounters:
        """The edge's events and the totals over its requests, derived from their stats."""
        return snapshot(self.events, self.finished_totals, [r.stats for r in self.requests.values()])

    # ------------------------------------------------------------ submission (any thread)

    def submit(
        self, prompt_ids, max_new_tokens: int, sampling: wire.Sampling, eps_req: float, emit: Emit, output=NO_OPTIONS
    ) -> int:
        decode = self.drafter.tokenizer.decode
        request = new_request(prompt_ids, max_new_tokens, sampling, eps_req, emit, output, decode)  # ValueError
        self.inbox.put(request)
        return request.id

    def cancel(self, request_id: int) -> None:
        """Abandon a request (any thread): its drafting stops and the cloud frees its state."""
        self.cancellations.put(request_id)

    # ------------------------------------------------------------ service loop

    def serve(self, should_stop: Callable[[], bool], on_ready: Callable[[], None] = lambda: None, client=None) -> None:
        """Run until should_stop(); `client` (a ClientFront) is polled in the same loop."""
        self.connect()
        on_ready()
        try:
            while not should_stop():
                self._step_guarded(client)
        finally:
            for request in self.scheduler.everyone():
                self.fail(request, "the edge is shutting down")
            self.channel.close()
            if client is not None:
                client.close()

    def _step_guarded(self, client) -> None:
        """Errors inside a request are contained where they happen; anything that still escapes a
        step is counted and reported, and the loop goes on rather than failing every request."""
        try:
            self.step(client)
        except Exception as error:
            self.events.request_errors += 1
            print(f"asyncspec edge: a service step failed: {type(error).__name__}: {error}", flush=True)
            time.sleep(0.01)  # a fault that repeats every step must not spin a core

    def step(self, client=None) -> None:
        self._admit()
        poller = zmq.Poller()
        poller.register(self.channel.socket, zmq.POLLIN)
        if client is not None:
            poller.register(client.socket, zmq.POLLIN)
        events = dict(poller.poll(0 if self._can_draft() else 5))
        if self.channel.socket in events:
            self._drain_cloud()
        if client is not None:  # every turn: it also sends what its tokenizing worker failed
            client.drain(self)
        self.liveness.check()
        self.liveness.retransmit()
        if self._can_draft():
            self._draft_next()

    def connect(self) -> None:
        if self.channel is not None:
            self.channel.close()
        socket = make_socket(
            self.context, zmq.DEALER, self.cloud_address, False, self.max_message_bytes, self.curve, self.connection_id
        )
        self.channel = Channel(socket, self.traffic, self._rejected_reply)

    def _rejected_reply(self, identity: bytes | None, error: wire.ProtocolError) -> None:
        """A cloud reply that failed its checks: its request cannot be trusted to go on."""
        self.events.invalid_replies += 1
        request = self.requests.get(wire.request_of(error.message)) if error.message is not None else None
        if request is not None:
            self.fail(request, f"the cloud sent an invalid reply ({error})")

    def _drain_cloud(self, limit: int = 1000) -> None:
        for _ in range(limit):
            if not self.channel.socket.poll(0):
                return
            received = self.channel.receive()
            if received is None:
                continue
            self.liveness.heard()
            self._handle_guarded(received[1])

    def _handle_guarded(self, message: wire.Message) -> None:
        try:
            self._handle(message)
        except Exception as error:  # contained to the request the reply is about
            self._request_error(self.requests.get(wire.request_of(message)), error)
        request_id = wire.request_of(message)
        if request_id is not None and request_id not in self.requests:
            self.traffic.forget(request_id)  # replies about unknown requests must not grow the byte counters

    def _request_error(self, request: EdgeRequest | None, error: Exception) -> None:
        self.events.request_errors += 1
        if request is not None:
            self.fail(request, f"the edge failed this request: {type(error).__name__}: {error}")

    def send(self, message: wire.Message, request: EdgeRequest | None = None) -> None:
        size = self.channel.send(message)
        if request is not None:
            request.stats.uplink_bytes += size
            if isinstance(message, wire.Block):
                request.stats.block_bytes += size

    def open_message(self, request: EdgeRequest) -> wire.Open:
        correction = self.policy.correction
        return request.open_message(correction.first_k, correction.first_proposals)

    # ------------------------------------------------------------ admission

    def _drop_cancelled(self) -> None:
        while True:
            try:
                request_id = self.cancellations.get_nowait()
            except queue.Empty:
                return
            request = self.scheduler.find(request_id)
            if request is not None:  # else it had already finished
                self.events.cancelled += 1
                self.fail(request, "cancelled by the client")

    def _admit(self) -> None:
        while True:
            try:
                request = self.inbox.get_nowait()
            except queue.Empty:
                break
            self.events.submitted += 1
            if not self.scheduler.enqueue(request):
                self.fail(request, "the edge is overloaded (too many waiting requests)", capacity=True)
        self._drop_cancelled()  # after the inbox: a cancel may follow its submission closely
        if self.fatal:
            for request in list(self.waiting):
                self.fail(request, self.fatal)
        if self.cloud is None:
            return
        for request in self.scheduler.admissible():
            try:
                self._start(request)
            except Exception as error:  # e.g. the drafter's prefill: this request fails, not the edge
                self._request_error(request, error)

    def _start(self, request: EdgeRequest) -> None:
        request.stats.started = time.monotonic()
        request.limit = min(request.max_new_tokens, self.cloud.max_length - len(request.prompt) + 1)
        if request.limit < 1:
            self.fail(request, f"the prompt ({len(request.prompt)} tokens) leaves no room in the model's positions")
            return
        request.drafter = PrefixDrafter(self.drafter, self.drafter)
        request.drafter.start(DecodeRequest(request.prompt, max_new_tokens=request.max_new_tokens))
        self.scheduler.activate(request)
        self.send(self.open_message(request), request)

    # ------------------------------------------------------------ drafting (confirmed prefixes only)

    def _can_draft(self) -> bool:
        return bool(self.scheduler.ready) and self.cloud is not None

    def _draft_next(self) -> None:
        request = self.scheduler.next_draftable()
        if request is None:
            return
        start = time.perf_counter()
        try:
            block = draft_block(request, self.policy, self.cloud.max_length, ahead=request.open is not None)
        except Exception as error:  # the drafter failed on this request's input: fail it alone
            self._request_error(request, error)
            return
        elapsed = time.perf_counter() - start
        request.stats.draft_s += elapsed
        if block is not None:
            block.draft_s = elapsed
            self._open(request, block)

    def _open(self, request: EdgeRequest, block: OpenBlock) -> None:
        open_now = (request.open is not None) + len(request.ahead)
        if open_now >= self.policy.max_open_per_request:  # the invariant; never expected
            self.events.open_block_violations += 1
            raise AssertionError(f"request {request.id} already has {open_now} open block(s)")
        if request.open is None:
            request.open = block
        else:
            request.ahead.append(block)
        request.stats.max_open_blocks = max(request.stats.max_open_blocks, open_now + 1)
        self.events.blocks_sent += 1
        self.send(block.message, request)
        block.size = len(wire.encode(block.message))
        self.scheduler.mark_ready(request)  # runahead: keep drafting this request's next block

    # ------------------------------------------------------------ replies

    def _handle(self, message: wire.Message) -> None:
        if isinstance(message, wire.Pong):
            self.liveness.pong(message)
            return
        request = self.requests.get(wire.request_of(message))
        problem = validation.reply_problem(message, self.drafter.vocab_size)
        if problem:
            self.events.invalid_replies += 1
            if request is not None:
                self.fail(request, f"the cloud sent an invalid reply ({problem})")
            return
        if isinstance(message, wire.Verdict):
            self._verdict(request, message)
        elif isinstance(message, wire.Correction):
            self._correction(request, message)
        elif isinstance(message, wire.Nack):
            self.liveness.nack(request, message)

    def _current_block(self, request: EdgeRequest | None, block_id: wire.BlockId) -> OpenBlock | None:
        block = request.open if request is not None else None
        if block is None or block.id != block_id:
            self._stale_reply(request)
            return None
        return block

    def _stale_reply(self, request: EdgeRequest | None) -> None:
        if request is None:
            self.events.unattributed_stale_replies += 1
        else:
            request.stats.stale_replies += 1

    def _verdict(self, request: EdgeRequest | None, verdict: wire.Verdict) -> None:
        block = self._current_block(request, verdict.id)
        if block is None or block.accepted is not None:
            if block is not None:  # a duplicate verdict of the open block
                self._stale_reply(request)
            return
        try:
            block.logprobs = checked_verdict(verdict, block, request.logprobs)
        except ValueError as error:
            self.fail(request, f"the cloud sent an impossible verdict ({error})")
            return
        rejected = verdict.token < 0
        block.accepted = verdict.accepted
        block.sent_at = time.monotonic()
        if not rejected:
            settled_in_verdict(request, verdict)
            self._settle(request, block, verdict.token)
        elif block.q_rows is None:
            self.fail(request, "the cloud asked for a correction of a greedy block")
        else:
            self._advance(request, block, open_session(request, block, verdict, self.policy.correction))

    def _correction(self, request: EdgeRequest | None, correction: wire.Correction) -> None:
        block = self._current_block(request, correction.id)
        if not answers_query(block, correction):
            return
        step = apply_answer(block, correction)
        if isinstance(step, str):
            self.fail(request, step)
        else:
            self._advance(request, block, step)

    def _advance(self, request: EdgeRequest, block: OpenBlock, step: Decided | Ask) -> None:
        if isinstance(step, Decided):
            request.stats.corrections.observe(step, rounds=block.queries)
            self._settle(request, block, step.token, step.p)
            return
        block.asked = step
        block.sent_at = time.monotonic()
        block.queries += 1
        request.stats.corrections.queries += 1
        self.send(wire.CorrectionQuery(block.id, step.kind, step.start, step.stop), request)

    # ------------------------------------------------------------ commit

    def _settle(self, request: EdgeRequest, block: OpenBlock, token: int, settled_p: float | None = None) -> None:
        request.stats.settle_block(len(block.candidates), block.accepted)
        request.acceptance.observe(block.accepted, len(block.candidates), self.policy.acceptance_decay)
        request.open = None
        held = presumption_held(request, block, token)
        if not held:
            invalidate_ahead(request)
        entries = logprobs.of_tokens(*block.logprobs, settled_p) if block.logprobs is not None else None
        finish = commit(request, [*block.candidates[: block.accepted], token], self.drafter.eos_ids, entries)
        if finish is not None:
            self._finish(request, finish)
            return
        if held:
            request.open = request.ahead.pop(0)  # already sent; its verdict follows
            request.stats.promoted_blocks += 1
        self.scheduler.mark_ready(request)

    def _close_books(self, request: EdgeRequest, completed: bool) -> None:
        request.stats.finished = time.monotonic()
        request.stats.downlink_bytes = self.traffic.per_request_received.get(request.id, 0)
        self.traffic.forget(request.id)
        self.finished_totals.add(request.stats)
        for observe in self.closed_observers:  # final stats, before the request's client hears the end
            observe(request, completed)

    def _finish(self, request: EdgeRequest, reason: str) -> None:
        invalidate_ahead(request)
        self.scheduler.remove(request)
        self.send(wire.Close(request.id), request)
        self._close_books(request, completed=True)
        self.events.completed += 1
        request.emit(DoneEvent(tuple(request.generated), reason, request.stats.as_dict()))

    def fail(self, request: EdgeRequest, reason: str, capacity: bool = False) -> None:
        """`capacity`: refused for lack of room (the client may retry later: HTTP 429), not for a fault."""
        if self.scheduler.remove(request) and self.channel is not None:
            self.send(wire.Close(request.id), request)
        self._close_books(request, completed=False)
        self.events.failed += 1
        request.emit(ErrorEvent(reason, tuple(request.generated), capacity))

    def summary(self) -> dict:
        return {"edge": self.counters.as_dict(), "traffic": self.traffic.as_dict(), "active": len(self.requests)}
