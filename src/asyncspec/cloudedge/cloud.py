"""The cloud verifier: holds the target and every open request's KV; verifies queued blocks of
many requests as one batch step (seed 002 §IV-C2) and answers each block.

Loop: drain the ROUTER socket (Open / Block / CorrectionQuery / Close / Ping) -> one global block
queue -> `work`: `run_batch` takes up to `max_batch` blocks (one per request), checks each against
its request's confirmed prefix, extends every request's KV (batcher.Batching: stacked calls where
proven bitwise equal to a call per request), decides, crops the rejected positions, replies. As a
Ray replica (replica.py) the front's step calls `handle` and `work` instead of this loop.

Idempotence: every reply is cached under its block id (and correction range); a duplicate or
late retransmission is answered from the cache byte for byte — nothing is sampled twice. The
acceptance uniforms, bonus draws and recovery proposals come from generators seeded by the
request's seed and the block's position, so even a restarted cloud re-derives the same random
outcomes, and a seeded request is reproducible (like target-only sampling with that seed).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import torch
import zmq

from asyncspec.cloudedge import limits, validation, verdicts
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.auth import CurveKeys
from asyncspec.cloudedge.batcher import Batching, BlockQueue
from asyncspec.cloudedge.cloud_state import CloudConfig, CloudCounters, CloudRequest, PendingOpen, reply_key
from asyncspec.cloudedge.transport import Channel, TrafficCounters, serving_channel
from asyncspec.models.hf_causal import CausalLMBackend
from asyncspec.models.selftest import require_invariant

__all__ = ["CloudConfig", "CloudRequest", "CloudVerifier"]


class CloudVerifier:
    def __init__(self, target: CausalLMBackend, config: CloudConfig | None = None):
        self.config = config or CloudConfig()
        report = require_invariant(target, "the cloud verifier", self.config.max_stack)
        self.batching = Batching.chosen(report, self.config.max_stack, torch.get_num_threads())
        self.target = target
        self.instance = random.getrandbits(31)
        self.requests: dict[int, CloudRequest] = {}
        self.queue = BlockQueue(self.config.max_queue)
        self.replies = limits.ReplyCache(self.config.decision_cache, self.config.decision_cache_bytes)
        self.quota = limits.quota_for(target, self.config)
        self.peers = limits.PeerLiveness(self.config.peer_dead_s)
        self.opening: dict[int, PendingOpen] = {}  # request -> its Open waiting for a prefill
        self.counters = CloudCounters()
        self.traffic = TrafficCounters()
        self.channel: Channel | None = None
        self._last_idle_check = time.monotonic()

    # ------------------------------------------------------------ service loop

    def serve(
        self,
        address: str,
        should_stop: Callable[[], bool],
        on_ready: Callable[[], None] = lambda: None,
        curve: CurveKeys | None = None,
    ) -> None:
        """Serve until should_stop(); `curve`: this cloud's CURVE keys (and the edges it admits)."""
        caps = limits.cloud_frame_caps(self.target.max_length, self.target.vocab_size, self.config.max_block)
        max_bytes = self.config.max_message_bytes
        with serving_channel(
            address, curve, max_bytes, self.traffic, self._invalid_frame, self._tracked, caps
        ) as channel:
            self.channel = channel
            self._loop(should_stop, on_ready)

    def _tracked(self, request: int, message: wire.Message) -> bool:
        """Byte counters only for requests that opened (an Open is counted; refused, it is forgotten)."""
        return request in self.requests or request in self.opening or isinstance(message, wire.Open)

    def _loop(self, should_stop: Callable[[], bool], on_ready: Callable[[], None]) -> None:
        poller = zmq.Poller()
        poller.register(self.channel.socket, zmq.POLLIN)
        on_ready()
        while not should_stop():
            timeout = 0 if self.queue or self.opening else self.config.poll_ms
            if poller.poll(timeout):
                self._drain(poller)
            self._wait_for_more(poller)
            self.work()

    def work(self) -> None:
        """A turn's work once frames were read: a batch if blocks wait, an idle prefill, idle drops."""
        if self.queue:
            self._run_batch_guarded()
        self._prefill_while_idle()
        self._drop_idle()

    def _run_batch_guarded(self) -> None:
        """A batch whose forward fails is lost, not the service: its blocks go unanswered, their
        edges retransmit, and the error is counted (per-block errors are contained in run_batch)."""
        try:
            self.run_batch()
        except Exception as error:
            self.counters.request_errors += 1
            print(f"asyncspec cloud: a verification batch failed: {type(error).__name__}: {error}", flush=True)

    def _drop_idle(self) -> None:
        now = time.monotonic()
        if now - self._last_idle_check < min(10.0, self.config.peer_dead_s / 4):
            return
        self._last_idle_check = now
        for request_id, request in list(self.requests.items()):
            if now - request.touched > self.config.idle_request_s:
                self._drop_request(request_id)
                self.counters.idle_dropped += 1
        dead = self.peers.dead(now)  # an edge that sent nothing (not even its heartbeat) this long is gone
        for request_id, owner in list(self.quota.owner.items()):
            if owner in dead:
                self._drop_request(request_id)
                self.counters.dead_peer_dropped += 1

    def _drain(self, poller: zmq.Poller, limit: int = 10_000) -> None:
        """Reads what waits, but once blocks are queued for at most `drain_s`: a flood of frames
        behind them delays their batch by that much, not by 10,000 frames' handling."""
        deadline = time.monotonic() + self.config.drain_s
        for _ in range(limit):
            if not poller.poll(0) or (self.queue and time.monotonic() > deadline):
                return
            received = self.channel.receive_authenticated()
            if received is not None:
                self.handle(*received)

    def _wait_for_more(self, poller: zmq.Poller) -> None:
        deadline = time.monotonic() + self.config.batch_wait_s
        while 0 < len(self.queue) < self.config.max_batch and time.monotonic() < deadline:
            if poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                self._drain(poller)

    def _invalid_frame(self, identity: bytes | None, error: wire.ProtocolError) -> None:
        """A frame that failed its field checks: answer the request it names, so the edge learns why."""
        self.counters.invalid_frames += 1
        message = error.message
        request = wire.request_of(message) if message is not None else None
        if identity is not None and request is not None:
            base = message.id.base if hasattr(message, "id") else 0
            self._nack(identity, request, base, "invalid", str(error))

    def handle(self, identity: bytes, message: wire.Message, key: bytes | None = None) -> None:
        """One message (`key`: its sender's client key); an error fails its request only, never the loop."""
        self.peers.heard(identity)
        try:
            self._dispatch(identity, message, key)
        except Exception as error:  # a defect or an input no check foresaw: contain it to its request
            self._request_failed(identity, message, error)
        request_id = wire.request_of(message)
        if request_id is not None and request_id not in self.requests and request_id not in self.opening:
            self.traffic.forget(request_id)  # byte counters live only as long as their request

    def _request_failed(self, identity: bytes, message: wire.Message, error: Exception) -> None:
        self.counters.request_errors += 1
        request = wire.request_of(message)
        if request is None:
            return
        self._drop_request(request)
        base = message.id.base if hasattr(message, "id") else 0
        detail = f"the cloud failed this request: {type(error).__name__}: {error}"
        self._nack(identity, request, base, "invalid", detail)

    def _dispatch(self, identity: bytes, message: wire.Message, key: bytes | None) -> None:
        request_id = wire.request_of(message)
        if request_id is not None and not self.quota.owns(identity, request_id):
            self.counters.foreign_requests += 1  # another connection's request: no state, no cached reply
            base = message.id.base if hasattr(message, "id") else 0
            self._nack(identity, request_id, base, "invalid", "the request id belongs to another connection")
            return
        if isinstance(message, wire.Open):  # the one message whose handling depends on the key
            self._open(identity, message, key)
            return
        handlers: dict[type, Callable[[bytes, Any], None]] = {
            wire.Block: self._admit,
            wire.CorrectionQuery: self._correct,
            wire.Close: self._close,
            wire.Ping: self._ping,
        }
        request = self.requests.get(wire.request_of(message))
        if request is not None:
            request.touched = time.monotonic()
        handler = handlers.get(type(message))
        if handler is None:  # a cloud->edge message sent to the cloud: not ours to act on
            self.counters.nacks["unexpected"] += 1
            return
        handler(identity, message)

    def _send(self, identity: bytes, message: wire.Message, cache_key: tuple | None = None) -> None:
        frame = wire.encode(message)
        if cache_key is not None:
            self.replies.put(cache_key, frame, message)
        self.channel.send_frame(frame, message, identity)

    def _nack(self, identity: bytes, request: int, base: int, reason: str, detail: str = "") -> None:
        self.counters.nacks[reason] += 1
        self._send(identity, wire.Nack(request, base, reason, detail[:500]))

    def _resend_cached(self, identity: bytes, key: tuple) -> bool:
        if key not in self.replies:
            return False
        frame, message = self.replies[key]
        self.counters.answered_from_cache += 1
        self.channel.send_frame(frame, message, identity)
        return True

    # ------------------------------------------------------------ requests

    def _ping(self, identity: bytes, ping: wire.Ping) -> None:
        self.counters.pings += 1
        pong = wire.Pong(ping.sent, self.instance, self.target.vocab_size, self.target.max_length, len(self.queue))
        self._send(identity, pong)

    def _open(self, identity: bytes, message: wire.Open, key: bytes | None = None) -> None:
        tokens = wire.unpack_ids(message.tokens)
        existing = self.requests.get(message.request)
        known = [r.epoch for r in (existing, self.opening.get(message.request)) if r is not None]
        if known and message.epoch <= max(known):
            self.counters.stale_opens += 1  # a duplicated or late Open: the request has moved on
            return
        target = self.target
        problem = validation.open_problem(message, target.vocab_size, target.max_length, self.config.first_k_cap)
        if problem:
            self._nack(identity, message.request, len(tokens) + 1, "invalid", problem)
            return
        refusal = self.quota.refusal(identity, message.request, key)
        if refusal:
            self.counters.refused_opens += 1
            self._nack(identity, message.request, len(tokens) + 1, "full", refusal)
            return
        self.counters.opens += 1
        if existing is not None:  # a resynchronisation: the open block will be verified afresh
            self.replies.forget(message.request)
            if self._rewind(existing, message, tokens):
                return
        self.requests.pop(message.request, None)  # its KV no longer matches: blocks wait for the new prefill
        self.opening[message.request] = PendingOpen(identity, message, tokens)
        self.quota.add(identity, message.request, key)

    def _prefill(self, request_id: int) -> None:
        pending = self.opening.pop(request_id)
        tokens, message = pending.tokens, pending.message
        state = self.target.empty_state()
        if tokens:  # the same blocks as target-only decoding of this prompt (+ output so far)
            self.target.prefill_tokens(state, tokens, message.prompt_len)
        self.requests[request_id] = CloudRequest.opened(message, state)

    def _prefill_guarded(self, request_id: int, identity: bytes, message: wire.Message) -> bool:
        """Prefill a pending request; a failure fails that request only (False)."""
        try:
            self._prefill(request_id)
            return True
        except Exception as error:
            self._request_failed(identity, message, error)
            return False

    def _prefill_while_idle(self) -> None:
        """With no block queued, prefill the oldest pending Open (one per loop turn)."""
        if self.opening and not self.queue:
            request_id, pending = next(iter(self.opening.items()))
            self._prefill_guarded(request_id, pending.identity, pending.message)

    def _rewind(self, request: CloudRequest, message: wire.Open, tokens: list[int]) -> bool:
        """A resynchronisation whose prefix this cloud already holds: crop instead of re-prefilling."""
        state = request.state
        if not tokens or request.sampling != message.sampling or state.tokens[: len(tokens)] != tokens:
            return False
        if state.length > len(tokens):
            self.target.rollback(state, len(tokens))
        request.epoch, request.first_k = message.epoch, message.first_k
        request.first_proposals = message.first_proposals
        request.pending, request.expected_root = None, None
        self.counters.rewinds += 1
        return True

    def _drop_request(self, request: int) -> None:
        """Everything held for a request: its KV, its owner's quota, its cached replies, its byte counters."""
        self.requests.pop(request, None)
        self.opening.pop(request, None)
        self.quota.remove(request)
        self.replies.forget(request)
        self.traffic.forget(request)

    def _close(self, identity: bytes, message: wire.Close) -> None:
        if message.request in self.requests or message.request in self.opening:
            self._drop_request(message.request)
            self.counters.closes += 1

    # ------------------------------------------------------------ blocks

    def _admit(self, identity: bytes, block: wire.Block) -> None:
        self.counters.blocks += 1
        if self._resend_cached(identity, reply_key(block)):
            return
        admission, replaced = self.queue.admit(identity, block)
        if admission == "duplicate":
            self.counters.duplicate_in_queue += 1
        elif admission == "busy":
            self._nack(identity, block.id.request, block.id.base, "busy")
        elif admission == "superseded":
            self.counters.superseded += 1
            replaced_identity, replaced_block = replaced
            self._nack(replaced_identity, replaced_block.id.request, replaced_block.id.base, "stale")

    def _problem(self, block: wire.Block) -> tuple[str, str] | None:
        """Why this block cannot be verified against its request's confirmed prefix: (Nack reason,
        detail), or None when it can."""
        request = self.requests.get(block.id.request)
        if request is None:
            return "unknown", ""
        if block.id.config != request.sampling.digest():
            return "invalid", "the block's sampling digest differs from its request's"
        target, sampled = self.target, not request.sampling.greedy
        problem = validation.block_problem(block, sampled, target.vocab_size, target.max_length, self.config.max_block)
        if problem:
            return "invalid", problem
        if request.state.length < block.id.base - 1:
            return "unknown", ""  # the edge is ahead of what this cloud holds: resynchronise
        if request.state.length > block.id.base - 1:
            return "stale", ""
        if request.expected_root is not None and block.root != request.expected_root:
            return "stale", ""
        return None

    def _usable(self, identity: bytes, block: wire.Block) -> bool:
        """Can this block be verified in the coming step? Otherwise it is answered here (from the
        reply cache, or with a Nack) and leaves the queue."""
        if self._resend_cached(identity, reply_key(block)):
            return False
        pending = block.id.request in self.opening
        if pending and not self._prefill_guarded(block.id.request, identity, block):
            return False
        problem = self._problem(block)
        if problem:
            self._nack(identity, block.id.request, block.id.base, *problem)
        return problem is None

    def run_batch(self) -> None:
        batch = self.queue.take(self.config.max_batch, self._usable)
        if not batch:
            return
        requests = [self.requests[block.id.request] for _, block in batch]
        inputs = [[block.root, *wire.unpack_ids(block.candidates)] for _, block in batch]
        start = time.perf_counter()
        all_logits, wide_calls = self.batching.extend(self.target, [r.state for r in requests], inputs)
        self.counters.forward_s += time.perf_counter() - start
        self.counters.wide_calls += wide_calls
        self.counters.batches += 1
        self.counters.batched_blocks += len(batch)
        self.counters.largest_batch = max(self.counters.largest_batch, len(batch))
        self.counters.batch_sizes[len(batch)] += 1
        for (identity, block), request, logits in zip(batch, requests, all_logits, strict=True):
            try:
                self._answer(identity, block, request, logits)
            except Exception as error:  # fails this block's request only; the batch's others are answered
                self._request_failed(identity, block, error)

    def _answer(self, identity: bytes, block: wire.Block, request: CloudRequest, logits: torch.Tensor) -> None:
        self.counters.positions_verified += logits.shape[0]
        verdict = verdicts.decide(block, request, logits, self.target.greedy, self.counters)
        keep = block.id.base + verdict.accepted
        if request.state.length > keep:
            self.target.rollback(request.state, keep)
        self._send(identity, verdict, reply_key(block))

    # ------------------------------------------------------------ corrections

    def _correct(self, identity: bytes, query: wire.CorrectionQuery) -> None:
        key = (query.id.request, query.id.base, query.id.n, query.id.config, query.kind, query.start)
        if self._resend_cached(identity, key):
            return
        request = self.requests.get(query.id.request)
        pending = request.pending if request is not None else None
        if pending is None or pending.id != query.id:
            self._nack(identity, query.id.request, query.id.base, "stale")
            return
        self.counters.corrections[query.kind] += 1
        self._send(identity, verdicts.correction(query, pending, request.sampling), key)

    def summary(self) -> dict:
        return {
            "cloud": self.counters.as_dict(),
            "batching": self.batching.as_dict(),
            "traffic": self.traffic.as_dict(),
            "open_requests": len(self.requests) + len(self.opening),
            "kv_reserved_bytes": self.quota.kv_reserved,
            "kv_budget_bytes": self.quota.kv_budget,
        }
