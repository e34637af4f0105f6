"""The edge gateway: holds the drafter, the requests and their confirmed prefixes; drafts blocks
only from confirmed prefixes, keeps at most one open block per request (seed 002 §IV-C1) and,
while a block waits for the cloud, drafts for another ready request.

One thread runs `serve`: it owns the cloud DEALER socket and the optional client ROUTER socket.
Other threads (HTTP handlers) hand work in through `submit`, which is thread-safe.

Failures: pings every `heartbeat_s`; a Pong from a new cloud instance, a Nack("unknown"), or
silence longer than `dead_after_s` with work outstanding makes the edge resubmit (Open with the
confirmed prefix, then the open block — idempotent by block id). Silence beyond `give_up_s`
fails the outstanding requests with a clear error; nothing hangs.
"""

from __future__ import annotations

import queue
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import zmq

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge import validation
from asyncspec.cloudedge.auth import CurveKeys, connection_id
from asyncspec.cloudedge.correction import Ask, CorrectionSession, Decided, FidelityBudget
from asyncspec.cloudedge.limits import DEFAULT_MAX_MESSAGE_BYTES
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import EdgeRequest, Emit, OpenBlock
from asyncspec.cloudedge.transport import Channel, TrafficCounters, make_socket
from asyncspec.decoding.drafter import PrefixDrafter
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.sampling import make_generator


@dataclass
class EdgeCounters:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    blocks_sent: int = 0
    resubmitted_blocks: int = 0
    resyncs: int = 0
    cloud_lost: int = 0  # silence beyond dead_after_s with work outstanding
    cloud_restarts: int = 0  # a Pong from a new cloud instance
    stale_replies: int = 0  # verdicts / corrections for blocks no longer open (duplicates, late)
    nacks: Counter = field(default_factory=Counter)
    open_block_violations: int = 0  # attempts to open a second block of one request (never expected)
    invalidated_blocks: int = 0  # runahead blocks a verdict invalidated (runahead only)
    invalidated_tokens: int = 0
    promoted_blocks: int = 0  # runahead blocks whose presumption held
    max_open_blocks: int = 0  # most blocks of one request open at once
    request_errors: int = 0  # requests failed by an error while serving them (the edge goes on)
    cancelled: int = 0  # requests their client abandoned (an HTTP client that disconnected)
    invalid_replies: int = 0  # cloud replies that failed their checks (their request fails)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["nacks"] = dict(self.nacks)
        return out


@dataclass
class CloudInfo:
    instance: int
    vocab_size: int
    max_length: int


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
        self.waiting: deque[EdgeRequest] = deque()
        self.requests: dict[int, EdgeRequest] = {}
        self.ready: deque[int] = deque()
        self.counters = EdgeCounters()
        self.traffic = TrafficCounters()
        self.cloud: CloudInfo | None = None
        self.channel: Channel | None = None
        self.context = zmq.Context.instance()
        self.last_heard = time.monotonic()
        self.last_ping = 0.0
        # the first ping not yet followed by any message from the cloud; the cloud is judged by
        # how long that ping stays unanswered *after the socket was drained*, so an edge that was
        # itself busy (drafting, admitting many requests) does not mistake its own pause for a dead cloud
        self.unanswered_since: float | None = None
        self.fatal: str | None = None

    # ------------------------------------------------------------ submission (any thread)

    def submit(self, prompt_ids, max_new_tokens: int, sampling: wire.Sampling, eps_req: float, emit: Emit) -> int:
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if not 0 <= eps_req <= 1 or max_new_tokens < 1:
            raise ValueError("eps_req must be within [0, 1] and max_new_tokens >= 1")
        problem = validation.sampling_problem(sampling.temperature, sampling.seed)
        if problem:
            raise ValueError(problem)
        request_id = secrets.randbits(64)  # unpredictable: another peer cannot guess and touch it
        request = EdgeRequest(
            request_id,
            tuple(int(t) for t in prompt_ids),
            sampling,
            max_new_tokens,
            FidelityBudget(eps_req),
            emit,
            make_generator((sampling.seed + 0x5EED) % 2**64),  # the edge's own stream, independent of the cloud's
        )
        self.inbox.put(request)
        return request_id

    def cancel(self, request_id: int) -> None:
        """Abandon a request (any thread): its drafting stops and the cloud frees its state."""
        self.cancellations.put(request_id)

    # ------------------------------------------------------------ service loop

    def serve(self, should_stop: Callable[[], bool], on_ready: Callable[[], None] = lambda: None, client=None) -> None:
        """Run until should_stop(); `client` (a ClientFront) is polled in the same loop."""
        self._connect()
        on_ready()
        try:
            while not should_stop():
                self._step_guarded(client)
        finally:
            for request in list(self.requests.values()) + list(self.waiting):
                self._fail(request, "the edge is shutting down")
            self.channel.close()
            if client is not None:
                client.close()

    def _step_guarded(self, client) -> None:
        """Errors inside a request are contained where they happen; anything that still escapes a
        step is counted and reported, and the loop goes on rather than failing every request."""
        try:
            self.step(client)
        except Exception as error:
            self.counters.request_errors += 1
            print(f"asyncspec edge: a service step failed: {type(error).__name__}: {error}", flush=True)
            time.sleep(0.01)  # a fault that repeats every step must not spin a core

    def step(self, client=None) -> None:
        self._admit()
        busy = self._can_draft()
        poller = zmq.Poller()
        poller.register(self.channel.socket, zmq.POLLIN)
        if client is not None:
            poller.register(client.socket, zmq.POLLIN)
        events = dict(poller.poll(0 if busy else 5))
        if self.channel.socket in events:
            self._drain_cloud()
        if client is not None and client.socket in events:
            client.drain(self)
        self._liveness()
        self._retransmit()
        if self._can_draft():
            self._draft_next()

    def _connect(self) -> None:
        if self.channel is not None:
            self.channel.close()
        socket = make_socket(
            self.context, zmq.DEALER, self.cloud_address, False, self.max_message_bytes, self.curve, self.connection_id
        )
        self.channel = Channel(socket, self.traffic, self._rejected_reply)

    def _rejected_reply(self, identity: bytes | None, error: wire.ProtocolError) -> None:
        """A cloud reply that failed its checks: its request cannot be trusted to go on."""
        self.counters.invalid_replies += 1
        request = self.requests.get(wire.request_of(error.message)) if error.message is not None else None
        if request is not None:
            self._fail(request, f"the cloud sent an invalid reply ({error})")

    def _drain_cloud(self, limit: int = 1000) -> None:
        for _ in range(limit):
            if not self.channel.socket.poll(0):
                return
            received = self.channel.receive()
            if received is None:
                continue
            self.last_heard = time.monotonic()
            self.unanswered_since = None
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
        self.counters.request_errors += 1
        if request is not None:
            self._fail(request, f"the edge failed this request: {type(error).__name__}: {error}")

    def _send(self, message: wire.Message, request: EdgeRequest | None = None) -> None:
        size = self.channel.send(message)
        if request is not None:
            request.stats.uplink_bytes += size
            if isinstance(message, wire.Block):
                request.stats.block_bytes += size

    # ------------------------------------------------------------ admission

    def _drop_cancelled(self) -> None:
        while True:
            try:
                request_id = self.cancellations.get_nowait()
            except queue.Empty:
                return
            request = self.requests.get(request_id) or next((r for r in self.waiting if r.id == request_id), None)
            if request is None:
                continue  # it had already finished
            self.counters.cancelled += 1
            if request in self.waiting:
                self.waiting.remove(request)
            self._fail(request, "cancelled by the client")

    def _admit(self) -> None:
        while True:
            try:
                request = self.inbox.get_nowait()
            except queue.Empty:
                break
            self.counters.submitted += 1
            if len(self.waiting) >= self.policy.max_waiting:
                self._fail(request, "the edge is overloaded (too many waiting requests)", capacity=True)
            else:
                self.waiting.append(request)
        self._drop_cancelled()  # after the inbox: a cancel may follow its submission closely
        if self.fatal:
            for request in list(self.waiting):
                self._fail(request, self.fatal)
            self.waiting.clear()
        while self.cloud is not None and self.waiting and len(self.requests) < self.policy.max_active:
            request = self.waiting.popleft()
            try:
                self._start(request)
            except Exception as error:  # e.g. the drafter's prefill: this request fails, not the edge
                self._request_error(request, error)

    def _start(self, request: EdgeRequest) -> None:
        request.stats.started = time.monotonic()
        request.limit = min(request.max_new_tokens, self.cloud.max_length - len(request.prompt) + 1)
        if request.limit < 1:
            self._fail(request, f"the prompt ({len(request.prompt)} tokens) leaves no room in the model's positions")
            return
        request.drafter = PrefixDrafter(self.drafter, self.drafter)
        request.drafter.start(DecodeRequest(request.prompt, max_new_tokens=request.max_new_tokens))
        self.requests[request.id] = request
        self._send(self._open_message(request), request)
        self.ready.append(request.id)

    def _open_message(self, request: EdgeRequest) -> wire.Open:
        correction = self.policy.correction
        return request.open_message(correction.first_k, correction.first_proposals)

    # ------------------------------------------------------------ drafting (confirmed prefixes only)

    def _can_draft(self) -> bool:
        return bool(self.ready) and self.cloud is not None

    def _draftable(self, request: EdgeRequest | None) -> bool:
        """May this request draft a block now? From its confirmed prefix when nothing of it is open
        (and, without the pipeline, nothing of another request is open); from its unconfirmed prefix
        only under runahead."""
        if request is None:
            return False
        if request.open is None:
            return self.policy.pipeline or not any(r.open for r in self.requests.values())
        return self.policy.runahead and len(request.ahead) < self.policy.runahead_depth and self._room_ahead(request)

    def _next_draftable(self) -> EdgeRequest | None:
        for _ in range(len(self.ready)):
            request_id = self.ready.popleft()
            request = self.requests.get(request_id)
            if self._draftable(request):
                return request
            if request is not None and request.open is None:
                self.ready.append(request_id)  # waits for another request's block (no pipeline)
        return None

    def _mark_ready(self, request: EdgeRequest) -> None:
        if request.id not in self.ready:
            self.ready.append(request.id)

    def _draft_next(self) -> None:
        request = self._next_draftable()
        if request is None:
            return
        start = time.perf_counter()
        try:
            block = self._draft_block(request, ahead=request.open is not None)
        except Exception as error:  # the drafter failed on this request's input: fail it alone
            self._request_error(request, error)
            return
        elapsed = time.perf_counter() - start
        request.stats.draft_s += elapsed
        if block is not None:
            block.draft_s = elapsed
            self._open(request, block)

    def _room_ahead(self, request: EdgeRequest) -> bool:
        presumed = request.presumed()
        ends = any(t in self.drafter.eos_ids for t in presumed[len(request.generated) :])
        return not ends and len(presumed) + 2 < request.limit

    def _draft_block(self, request: EdgeRequest, ahead: bool = False) -> OpenBlock | None:
        """A block from the confirmed prefix, or (runahead) from the presumed one: then the first drafted
        token is the guess of the previous block's bonus and becomes this block's root."""
        generated = request.presumed() if ahead else request.generated
        base = len(request.prompt) + len(generated) + (1 if ahead else 0)
        used = len(generated) + (1 if ahead else 0)
        room = min(self._gamma(request), request.limit - used - 1, self.cloud.max_length - base)
        temperature = request.sampling.temperature
        candidates, q_rows, root = [], None, (None if ahead else request.confirmed[-1])
        if room > 0 or ahead:
            proposal = request.drafter.propose(
                generated,
                max(room, 0) + (1 if ahead else 0),
                min_confidence=self.policy.draft_min_confidence,
                temperature=temperature,
                generator=request.generator,
                keep_q=self.policy.uplink == "full",
            )
            if ahead and not proposal.tokens:
                return None  # the drafter has no room left: nothing to run ahead with
            skip = 1 if ahead else 0
            root = proposal.tokens[0] if ahead else root
            candidates = proposal.tokens[skip : skip + max(room, 0)]
            q_rows = proposal.q[skip : skip + len(candidates)] if proposal.q is not None else None
        q_bytes, q_full = b"", b""
        if q_rows is not None:
            if temperature > 0:
                q_bytes = wire.pack_probs(q_rows[torch.arange(len(candidates)), candidates])
            if self.policy.uplink == "full":  # the symmetric exchange uploads the distributions even when greedy
                q_full = wire.pack_probs(q_rows.reshape(-1))
        block_id = wire.BlockId(request.id, base, len(candidates), request.sampling.digest())
        message = wire.Block(block_id, root, wire.pack_ids(candidates), q_bytes, q_full)
        return OpenBlock(message, candidates, q_rows, time.monotonic())

    def _gamma(self, request: EdgeRequest) -> int:
        """Candidates for the request's next block: the policy's block size, or with adaptive_gamma the
        block length its running acceptance supports (EdgePolicy.gamma_for)."""
        if not self.policy.adaptive_gamma:
            return self.policy.block_size
        gamma = self.policy.gamma_for(request.acceptance.estimate)
        request.stats.gammas[gamma] += 1
        return gamma

    def _open(self, request: EdgeRequest, block: OpenBlock) -> None:
        open_now = (request.open is not None) + len(request.ahead)
        if open_now >= self.policy.max_open_per_request:  # the invariant; never expected
            self.counters.open_block_violations += 1
            raise AssertionError(f"request {request.id} already has {open_now} open block(s)")
        if request.open is None:
            request.open = block
        else:
            request.ahead.append(block)
        request.stats.max_open_blocks = max(request.stats.max_open_blocks, open_now + 1)
        self.counters.max_open_blocks = max(self.counters.max_open_blocks, open_now + 1)
        self.counters.blocks_sent += 1
        self._send(block.message, request)
        block.size = len(wire.encode(block.message))
        if self._draftable(request):
            self._mark_ready(request)  # runahead: keep drafting this request's next block

    # ------------------------------------------------------------ replies

    def _handle(self, message: wire.Message) -> None:
        if isinstance(message, wire.Pong):
            self._pong(message)
            return
        request = self.requests.get(wire.request_of(message))
        problem = validation.reply_problem(message, self.drafter.vocab_size)
        if problem:
            self.counters.invalid_replies += 1
            if request is not None:
                self._fail(request, f"the cloud sent an invalid reply ({problem})")
            return
        if isinstance(message, wire.Verdict):
            self._verdict(request, message)
        elif isinstance(message, wire.Correction):
            self._correction(request, message)
        elif isinstance(message, wire.Nack):
            self._nack(request, message)

    def _pong(self, pong: wire.Pong) -> None:
        if pong.vocab_size != self.drafter.vocab_size:
            self.fatal = (
                f"the cloud's vocabulary ({pong.vocab_size}) differs from the drafter's ({self.drafter.vocab_size})"
            )
            for request in list(self.requests.values()):
                self._fail(request, self.fatal)
            return
        restarted = self.cloud is not None and pong.instance != self.cloud.instance
        self.cloud = CloudInfo(pong.instance, pong.vocab_size, pong.max_length)
        if restarted:
            self.counters.cloud_restarts += 1
            self._resubmit_all()

    def _current_block(self, request: EdgeRequest | None, block_id: wire.BlockId) -> OpenBlock | None:
        block = request.open if request is not None else None
        if block is None or block.id != block_id:
            self.counters.stale_replies += 1
            if request is not None:
                request.stats.stale_replies += 1
            return None
        return block

    def _verdict(self, request: EdgeRequest | None, verdict: wire.Verdict) -> None:
        block = self._current_block(request, verdict.id)
        if block is None or block.accepted is not None:
            if block is not None:  # a duplicate verdict of the open block
                self.counters.stale_replies += 1
            return
        rejected = verdict.token < 0
        if not 0 <= verdict.accepted <= len(block.candidates) - rejected:
            self._fail(request, "the cloud sent an impossible verdict")
            return
        block.accepted = verdict.accepted
        block.sent_at = time.monotonic()
        if verdict.token >= 0:
            if verdict.settled_by:  # a rejection the cloud settled inside the verdict: no round trip
                mode = "cloud" if verdict.settled_by == "recovery" else "residual"
                request.stats.corrections.observe(Decided(verdict.token, mode), rounds=0)
            self._settle(request, block, verdict.token)
            return
        if block.q_rows is None:
            self._fail(request, "the cloud asked for a correction of a greedy block")
            return
        block.session = CorrectionSession(
            block.q_rows[verdict.accepted], request.budget, self.policy.correction, request.generator
        )
        support = wire.unpack_ids(verdict.support_ids)
        proposals = None
        if verdict.proposal_ids:  # round 0 of exact recovery, with the uniforms the cloud decided with
            proposals = (
                wire.unpack_ids(verdict.proposal_ids),
                wire.unpack_probs(verdict.proposal_p),
                wire.unpack_probs(verdict.proposal_u),
            )
        first = block.session.first(support, wire.unpack_probs(verdict.support_p), verdict.tail, proposals)
        self._advance(request, block, first)

    def _correction(self, request: EdgeRequest | None, correction: wire.Correction) -> None:
        block = self._current_block(request, correction.id)
        if (
            block is None
            or block.asked is None
            or (block.asked.kind, block.asked.start)
            != (
                correction.kind,
                correction.start,
            )
        ):
            return
        block.asked = None
        session = block.session
        if correction.kind == "topk":
            step = session.add_support(
                wire.unpack_ids(correction.ids), wire.unpack_probs(correction.p), correction.tail
            )
        elif correction.kind == "proposals":
            step = session.add_proposals(wire.unpack_ids(correction.ids), wire.unpack_probs(correction.p))
        else:
            p = wire.unpack_probs(correction.p)
            if p.numel() != session.q.numel():
                self._fail(request, "the cloud sent a distribution of the wrong size")
                return
            step = session.add_full(p)
        self._advance(request, block, step)

    def _advance(self, request: EdgeRequest, block: OpenBlock, step: Decided | Ask) -> None:
        if isinstance(step, Decided):
            request.stats.corrections.observe(step, rounds=block.queries)
            self._settle(request, block, step.token)
            return
        block.asked = step
        block.sent_at = time.monotonic()
        block.queries += 1
        request.stats.corrections.queries += 1
        self._send(wire.CorrectionQuery(block.id, step.kind, step.start, step.stop), request)

    def _nack(self, request: EdgeRequest | None, nack: wire.Nack) -> None:
        self.counters.nacks[nack.reason] += 1
        if request is None:
            return
        request.stats.nacks[nack.reason] += 1
        if nack.reason == "full":  # refused at its Open, whatever block is open: retrying would loop
            reason = nack.detail or "it holds its limit of requests"
            self._fail(request, f"the cloud refused the request: {reason}", capacity=True)
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
            self._fail(request, f"the cloud rejected the request as invalid{detail}")
        else:
            self._resync(request)

    # ------------------------------------------------------------ commit

    def _settle(self, request: EdgeRequest, block: OpenBlock, token: int) -> None:
        stats = request.stats
        stats.blocks += 1
        stats.drafted += len(block.candidates)
        stats.accepted += block.accepted
        request.acceptance.observe(block.accepted, len(block.candidates), self.policy.acceptance_decay)
        request.open = None
        held = self._runahead_held(request, block, token)
        for committed in [*block.candidates[: block.accepted], token]:
            if committed in self.drafter.eos_ids:
                self._finish(request, "eos")
                return
            request.generated.append(committed)
            now = time.monotonic()
            stats.token_times.append(now)
            stats.first_token = stats.first_token or now
            request.emit({"type": "token", "token": committed})
            if len(request.generated) >= request.limit:
                self._finish(request, "length")
                return
        if held:
            request.open = request.ahead.pop(0)  # already sent; its verdict follows
            request.stats.promoted_blocks += 1
            self.counters.promoted_blocks += 1
        if self._draftable(request):
            self._mark_ready(request)

    def _runahead_held(self, request: EdgeRequest, block: OpenBlock, token: int) -> bool:
        """Did the verdict confirm what the first runahead block presumed (all accepted, bonus guessed)?
        If not, every runahead block of the request is invalid: discard and count it."""
        if not request.ahead:
            return False
        if block.accepted == len(block.candidates) and token == request.ahead[0].message.root:
            return True
        self._invalidate_ahead(request)
        return False

    def _invalidate_ahead(self, request: EdgeRequest) -> None:
        for dropped in request.ahead:
            stats = request.stats
            stats.invalidated_blocks += 1
            stats.invalidated_tokens += 1 + len(dropped.candidates)
            stats.invalidated_uplink_bytes += dropped.size
            stats.invalidated_draft_s += dropped.draft_s
            self.counters.invalidated_blocks += 1
            self.counters.invalidated_tokens += 1 + len(dropped.candidates)
            request.invalidated_bases[dropped.id.base] += 1
        request.ahead.clear()

    def _close_books(self, request: EdgeRequest) -> None:
        request.stats.finished = time.monotonic()
        request.stats.downlink_bytes = self.traffic.per_request_received.get(request.id, 0)
        self.traffic.forget(request.id)

    def _finish(self, request: EdgeRequest, reason: str) -> None:
        self._invalidate_ahead(request)
        self.requests.pop(request.id, None)
        self._send(wire.Close(request.id), request)
        self._close_books(request)
        self.counters.completed += 1
        request.emit(
            {
                "type": "done",
                "tokens": list(request.generated),
                "finish_reason": reason,
                "stats": request.stats.as_dict(),
            }
        )

    def _fail(self, request: EdgeRequest, reason: str, capacity: bool = False) -> None:
        """`capacity`: refused for lack of room (the client may retry later: HTTP 429), not for a fault."""
        if self.requests.pop(request.id, None) is not None and self.channel is not None:
            self._send(wire.Close(request.id), request)
        self._close_books(request)
        self.counters.failed += 1
        request.emit({"type": "error", "message": reason, "tokens": list(request.generated), "capacity": capacity})

    # ------------------------------------------------------------ failures

    def _resync(self, request: EdgeRequest) -> None:
        """Tell the cloud the confirmed prefix again, then resend the open block (same id)."""
        request.stats.resyncs += 1
        self.counters.resyncs += 1
        if request.stats.resyncs > self.policy.max_resyncs:
            self._fail(request, "the cloud kept losing this request's state")
            return
        request.epoch += 1
        self._invalidate_ahead(request)
        self._send(self._open_message(request), request)
        block = request.open
        if block is not None:
            block.accepted, block.session, block.asked, block.retry_at = None, None, None, None
            block.sent_at = time.monotonic()
            request.stats.resubmits += 1
            self.counters.resubmitted_blocks += 1
            self._send(block.message, request)

    def _resubmit_all(self) -> None:
        for request in list(self.requests.values()):
            self._resync(request)

    def _ping(self, now: float) -> None:
        self.last_ping = now
        self._send(wire.Ping(now))
        if self.unanswered_since is None:
            self.unanswered_since = now

    def _liveness(self) -> None:
        """Called right after the socket was drained: an unanswered ping is real silence."""
        now = time.monotonic()
        # a ping only after heartbeat_s without a word from the cloud (verdicts and corrections are proof of
        # life too): pings were most of the uplink per committed token while the cloud was answering blocks
        quiet = self.cloud is None or now - self.last_heard >= self.policy.heartbeat_s
        if quiet and now - self.last_ping >= self.policy.heartbeat_s:
            self._ping(now)
        if not (self.requests or self.waiting) or self.unanswered_since is None:
            return
        silence = now - self.unanswered_since
        if now - self.last_heard > self.policy.give_up_s and silence > self.policy.dead_after_s:
            reason = f"the cloud at {self.cloud_address} did not answer for {now - self.last_heard:.0f} s"
            for request in list(self.requests.values()) + list(self.waiting):
                self._fail(request, reason)
            self.waiting.clear()
            return
        if silence > self.policy.dead_after_s:
            self.counters.cloud_lost += 1
            self._connect()  # a fresh socket: nothing queued for a dead peer survives
            self.unanswered_since = None
            self._ping(now)
            self._resubmit_all()

    def _retransmit(self) -> None:
        """Resend what a live cloud has not answered: a block after a busy back-off, or any block
        or correction query unanswered for dead_after_s (a lost frame; idempotent by block id)."""
        now = time.monotonic()
        for request in self.requests.values():
            block = request.open
            if block is None:
                continue
            busy_over = block.retry_at is not None and now >= block.retry_at
            if not busy_over and now - block.sent_at <= self.policy.dead_after_s:
                continue
            block.retry_at, block.sent_at = None, now
            request.stats.resubmits += 1
            self.counters.resubmitted_blocks += 1
            if block.asked is not None:
                asked = block.asked
                self._send(wire.CorrectionQuery(block.id, asked.kind, asked.start, asked.stop), request)
            elif block.accepted is None:
                self._send(block.message, request)

    def summary(self) -> dict:
        return {"edge": self.counters.as_dict(), "traffic": self.traffic.as_dict(), "active": len(self.requests)}
