"""Batched verification: a batch step over several requests' blocks decides exactly what verifying
one request at a time decides."""

from __future__ import annotations

import pytest
import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
from asyncspec.models.base import DecodeRequest
from cloudedge_support import model_pair


class RecordingChannel:
    """Stands in for the ROUTER socket: records what the cloud would send."""

    def __init__(self):
        self.sent: list[wire.Message] = []
        self.to: list[bytes] = []

    def send_frame(self, frame, message, identity=None):
        self.sent.append(wire.decode(frame))
        self.to.append(identity)
        return len(frame)


def _verdicts(target, max_batch: int, sampling: wire.Sampling, rounds: int = 4):
    """Drive a cloud through `rounds` blocks of 8 requests, batched up to max_batch."""
    cloud = CloudVerifier(target, CloudConfig(max_batch=max_batch))
    cloud.channel = RecordingChannel()
    generator = torch.Generator().manual_seed(11)
    prompts = [
        torch.randint(0, 95, (int(n),), generator=generator).tolist()
        for n in torch.randint(1, 10, (8,), generator=generator)
    ]
    confirmed = {i: list(p) for i, p in enumerate(prompts)}
    for i, prompt in enumerate(prompts):
        cloud.handle(
            b"edge", wire.Open(i, wire.pack_ids(prompt[:-1]), len(prompt), sampling.temperature, sampling.seed, 4, 0)
        )
    history = []
    for _ in range(rounds):
        for i in range(8):
            candidates = torch.randint(0, 95, (5,), generator=generator).tolist()
            # the target's own next token first, so that some candidates are accepted
            candidates[0] = target.greedy(target.prefill(DecodeRequest(tuple(confirmed[i]))).next_logits)[0]
            q = wire.pack_probs([0.5] * 5) if not sampling.greedy else b""
            block_id = wire.BlockId(i, len(confirmed[i]), 5, sampling.digest())
            cloud.handle(b"edge", wire.Block(block_id, confirmed[i][-1], wire.pack_ids(candidates), q))
        while cloud.queue:
            cloud.run_batch()
        verdicts = [m for m in cloud.channel.sent if isinstance(m, wire.Verdict)]
        cloud.channel.sent.clear()
        assert len(verdicts) == 8
        for verdict in verdicts:
            # the next root: the cloud's token, or after a sampled rejection the top support entry
            token = verdict.token if verdict.token >= 0 else wire.unpack_ids(verdict.support_ids)[0]
            history.append((verdict.id.request, verdict.id.base, verdict.accepted, verdict.token))
            confirmed[verdict.id.request].extend([*_accepted(cloud, verdict), token])
    return sorted(history), cloud.counters


def _accepted(cloud, verdict) -> list[int]:
    state = cloud.requests[verdict.id.request].state
    return state.tokens[verdict.id.base : verdict.id.base + verdict.accepted]


@pytest.mark.parametrize("sampling", [wire.Sampling(), wire.Sampling(1.0, 7)], ids=["greedy", "sampled"])
def test_batched_verification_decides_like_one_request_at_a_time(sampling):
    target, _ = model_pair(noise=0.05)
    alone, alone_counters = _verdicts(target, 1, sampling)
    batched, batched_counters = _verdicts(target, 8, sampling)
    assert alone_counters.largest_batch == 1 and batched_counters.largest_batch == 8
    assert batched == alone
    assert any(accepted > 0 for _, _, accepted, _ in batched) and any(accepted < 5 for _, _, accepted, _ in batched)


def test_a_queued_block_resubmitted_from_another_connection_is_refused():
    """Requests belong to the connection that opened them (issue 15): a reconnecting edge keeps its
    routing id (EdgeGateway.connection_id), so a block for request 1 from another identity is a
    foreign peer's and gets a Nack; the owner's queued block is answered once, to the owner."""
    target, _ = model_pair(noise=0.05)
    cloud = CloudVerifier(target, CloudConfig())
    cloud.channel = RecordingChannel()
    cloud.handle(b"old", wire.Open(1, wire.pack_ids([3, 4]), 3, 0.0, 0, 4, 0))
    block = wire.Block(wire.BlockId(1, 3, 2, wire.Sampling().digest()), 5, wire.pack_ids([6, 7]), b"")
    cloud.handle(b"old", block)
    cloud.handle(b"new", block)
    cloud.run_batch()
    assert cloud.channel.to == [b"new", b"old"] and cloud.counters.foreign_requests == 1
    assert cloud.counters.nacks == {"invalid": 1} and cloud.counters.batched_blocks == 1
