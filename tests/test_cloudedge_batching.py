"""Batched verification: a batch step over several requests' blocks decides exactly what verifying
one request at a time decides, with a call per request and with the requests' blocks stacked into
wide calls (issue 25 §1): the verdicts, and the logits they are decided from, bit for bit, and those
logits equal target-only's. The batch check of the invariance self-test passes on the engine, and
fails on a deliberately block-variant linear, where the cloud falls back to a call per request."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.batcher import PER_REQUEST, STACKED, Batching
from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
from asyncspec.cloudedge.cloud_state import CloudCounters
from asyncspec.models.base import DecodeRequest
from asyncspec.models.selftest import check_invariance
from cloudedge_support import model_pair
from conftest import BF16_REAL, INT8_REAL, requires_qwen_05b, tiny_causal


class RecordingChannel:
    """Stands in for the ROUTER socket: records what the cloud would send."""

    def __init__(self):
        self.sent: list[wire.Message] = []
        self.to: list[bytes] = []

    def send_frame(self, frame, message, identity=None):
        self.sent.append(wire.decode(frame))
        self.to.append(identity)
        return len(frame)


@dataclass
class Run:
    """What a cloud decided over the rounds: (request, base, accepted, token) per verdict, its
    counters, the float32 logits each block was decided from, and each block's prompt, output
    confirmed before it and candidates (for the target-only reference)."""

    history: list = field(default_factory=list)
    counters: CloudCounters | None = None
    logits: dict = field(default_factory=dict)
    blocks: dict = field(default_factory=dict)
    batching: dict = field(default_factory=dict)


def _verdicts(target, max_batch: int, sampling: wire.Sampling, rounds: int = 4, max_stack: int = 8, force=None) -> Run:
    """Drive a cloud through `rounds` blocks of 8 requests, batched up to max_batch, stacked up to
    max_stack blocks per call where the batch check allows it (`force`: a Batching imposed)."""
    cloud = CloudVerifier(target, CloudConfig(max_batch=max_batch, max_stack=max_stack))
    cloud.channel = RecordingChannel()
    cloud.batching = force or cloud.batching
    run = Run(batching=cloud.summary()["batching"])
    answer = cloud._answer

    def recording(identity, block, request, logits):
        run.logits[(block.id.request, block.id.base)] = logits.clone()
        answer(identity, block, request, logits)

    cloud._answer = recording
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
    for _ in range(rounds):
        for i in range(8):
            candidates = torch.randint(0, 95, (5,), generator=generator).tolist()
            # the target's own next token first, so that some candidates are accepted
            candidates[0] = target.greedy(target.prefill(DecodeRequest(tuple(confirmed[i]))).next_logits)[0]
            q = wire.pack_probs([0.5] * 5) if not sampling.greedy else b""
            block_id = wire.BlockId(i, len(confirmed[i]), 5, sampling.digest())
            run.blocks[(i, len(confirmed[i]))] = (prompts[i], confirmed[i][len(prompts[i]) :], candidates)
            cloud.handle(b"edge", wire.Block(block_id, confirmed[i][-1], wire.pack_ids(candidates), q))
        while cloud.queue:
            cloud.run_batch()
        verdicts = [m for m in cloud.channel.sent if isinstance(m, wire.Verdict)]
        cloud.channel.sent.clear()
        assert len(verdicts) == 8
        for verdict in verdicts:
            # the next root: the cloud's token, or after a sampled rejection the top support entry
            token = verdict.token if verdict.token >= 0 else wire.unpack_ids(verdict.support_ids)[0]
            run.history.append((verdict.id.request, verdict.id.base, verdict.accepted, verdict.token))
            confirmed[verdict.id.request].extend([*_accepted(cloud, verdict), token])
    run.history.sort()
    run.counters = cloud.counters
    return run


def _accepted(cloud, verdict) -> list[int]:
    state = cloud.requests[verdict.id.request].state
    return state.tokens[verdict.id.base : verdict.id.base + verdict.accepted]


def _target_only_rows(target, prompt: list[int], output: list[int], candidates: list[int]) -> torch.Tensor:
    """Target-only decoding's logits, teacher-forced along the output confirmed so far and then the
    candidates, one token per call: the rows the cloud's block must reproduce."""
    state = target.prefill(DecodeRequest(tuple(prompt)))
    for token in output:
        target.extend(state, [token])
    return torch.stack([state.next_logits, *(target.extend(state, [token])[-1] for token in candidates)])


def _differs_from_target_only(target, run: Run) -> list[tuple[int, int]]:
    """The blocks whose logits are not bitwise target-only's."""
    return [
        key
        for key, block in sorted(run.blocks.items())
        if not torch.equal(run.logits[key], _target_only_rows(target, *block))
    ]


def _greedy_as_target_only(target, run: Run) -> bool:
    """Every greedy verdict accepts exactly the candidates target-only would have produced, and
    its token is target-only's next token."""
    for request, base, accepted, token in run.history:
        *_, candidates = block = run.blocks[(request, base)]
        greedy = target.greedy(_target_only_rows(target, *block))
        agree = next((i for i, (c, g) in enumerate(zip(candidates, greedy, strict=False)) if c != g), len(candidates))
        if (accepted, token) != (agree, greedy[agree]):
            return False
    return True


@pytest.mark.parametrize("sampling", [wire.Sampling(), wire.Sampling(1.0, 7)], ids=["greedy", "sampled"])
def test_batched_verification_decides_like_one_request_at_a_time(sampling):
    target, _ = model_pair(noise=0.05)
    alone = _verdicts(target, 1, sampling)
    per_request = _verdicts(target, 8, sampling, max_stack=1)
    stacked = _verdicts(target, 8, sampling)
    assert alone.counters.largest_batch == 1 and stacked.counters.largest_batch == 8
    assert per_request.batching["mode"] == PER_REQUEST and per_request.counters.wide_calls == 0
    assert stacked.batching["mode"] == STACKED and stacked.batching["most_blocks"] == 8
    assert stacked.counters.wide_calls == stacked.counters.batches  # 8 blocks of 6 rows: one 64-row call each
    assert stacked.history == per_request.history == alone.history
    assert stacked.logits.keys() == alone.logits.keys()
    assert all(torch.equal(stacked.logits[key], alone.logits[key]) for key in alone.logits)
    assert _differs_from_target_only(target, stacked) == []
    if sampling.greedy:
        assert _greedy_as_target_only(target, stacked)
    history = stacked.history
    assert any(accepted > 0 for _, _, accepted, _ in history) and any(accepted < 5 for _, _, accepted, _ in history)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_extend_stacked_is_bitwise_extend_for_requests_at_any_position_and_length(dtype):
    """Requests at different lengths, blocks of 1 to 20 rows (the long one spans three blocks, in
    one call), stacked up to 4 blocks per call: each request's logits and KV are bitwise
    what its own `extend` gives."""
    target = tiny_causal(dtype, seed=21)
    generator = torch.Generator().manual_seed(21)
    prompts = [torch.randint(0, 90, (n,), generator=generator).tolist() for n in (3, 70, 9, 17, 1)]
    inputs = [torch.randint(0, 90, (n,), generator=generator).tolist() for n in (8, 20, 1, 5, 8)]
    alone = [target.prefill(DecodeRequest(tuple(prompt))) for prompt in prompts]
    stacked = [target.prefill(DecodeRequest(tuple(prompt))) for prompt in prompts]
    expected = [target.extend(state, tokens) for state, tokens in zip(alone, inputs, strict=True)]
    got = target.extend_stacked(stacked, inputs, 4)  # 7 blocks: calls of 4 (the 20 rows in it), 2, 1
    for mine, theirs, state, reference in zip(got, expected, stacked, alone, strict=True):
        assert torch.equal(mine, theirs) and torch.equal(state.next_logits, reference.next_logits)
        assert state.tokens == reference.tokens
        for a, b in zip(
            state.cache.keys + state.cache.values, reference.cache.keys + reference.cache.values, strict=True
        ):
            assert torch.equal(a[:, : state.length], b[:, : state.length])
    with pytest.raises(ValueError, match="each request once"):
        target.extend_stacked([stacked[0], stacked[0]], [[1], [2]], 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_the_batch_check_passes_on_the_engine(dtype):
    target = tiny_causal(dtype, seed=22)
    report = check_invariance(target, stacked_blocks=8)
    assert report.passed and report.stacked_equal and report.stacked_difference == "", report.summary()
    assert report.stacking(torch.get_num_threads()) == 8
    assert "stacked calls of 2, 4, 8 blocks equal" in report.summary()
    batching = Batching.chosen(report, 4, torch.get_num_threads())  # the cloud's cap below the checked one
    assert (batching.mode, batching.most_blocks) == (STACKED, 4)
    assert Batching.chosen(report, 8, torch.get_num_threads() + 1).mode == PER_REQUEST  # checked at another count


@pytest.mark.qwen
@requires_qwen_05b
@pytest.mark.parametrize("dtype", [BF16_REAL, INT8_REAL])
def test_the_batch_check_passes_on_real_qwen_05b(dtype):
    """The whole real model, stacked up to 8 blocks. In int8 rows are invariant at any width by
    construction (per-row activation scales, integer sums; this checks the rest of the model too).
    In bf16 it depends on the CPU's kernels: the EPYCs gave equal rows up to 64-row calls; an AMX
    Xeon (2026-12-04) up to 32 rows, and its 64-row call differed, so there the cloud stacks 4."""
    from asyncspec.models.offline import prepare
    from asyncspec.models.registry import load_decoder

    prepare("qwen2.5-coder-0.5b")
    report = check_invariance(load_decoder("qwen2.5-coder-0.5b", dtype), stacked_blocks=8)
    assert report.passed, report.summary()
    if dtype == INT8_REAL:
        assert report.stacked_equal and report.stacked_proven == 8, report.summary()
    else:
        assert report.stacked_proven >= 2, report.summary()  # pairs of blocks were equal on every CPU seen
        assert report.stacked_equal == (report.stacked_proven == 8), report.summary()
    assert report.stacking(torch.get_num_threads()) == report.stacked_proven


def _width_variant_linear(monkeypatch, rows: int) -> None:
    """A deliberately width-variant kernel: every float linear adds one unit in the last place to
    each output of a call wider than `rows` rows, as a kernel whose blocking follows the call's
    width would round differently. An 8-row call is untouched, so the per-request self-test passes."""
    linear = torch.nn.functional.linear

    def variant(x, weight, bias=None):
        out = linear(x, weight, bias)
        if x.reshape(-1, x.shape[-1]).shape[0] > rows:
            out = torch.nextafter(out, torch.tensor(float("inf"), dtype=out.dtype))
        return out

    monkeypatch.setattr(torch.nn.functional, "linear", variant)


@pytest.fixture
def block_variant_linear(monkeypatch):
    _width_variant_linear(monkeypatch, 8)


def test_a_kernel_variant_only_past_32_rows_stacks_4_blocks_and_stays_target_only(monkeypatch):
    """Where wide calls round differently only past some width (AMX bf16 at 64 rows), the cloud
    stacks what the batch check proved, not nothing and not everything asked."""
    _width_variant_linear(monkeypatch, 32)
    target, _ = model_pair(noise=0.05)
    target.name += "-variant-past-32"  # its own verdict, never the engine's cached one
    report = check_invariance(target, stacked_blocks=8)
    assert report.passed and report.stacked_equal is False and report.stacked_proven == 4, report.summary()
    assert "stacked calls of 2, 4 blocks equal, of 8 blocks DIFFERENT" in report.summary()
    stacked = _verdicts(target, 8, wire.Sampling())
    assert (stacked.batching["mode"], stacked.batching["most_blocks"]) == (STACKED, 4)
    assert "wider calls differ (a call of 8 stacked blocks" in stacked.batching["why"]
    assert stacked.counters.wide_calls > 0 and _differs_from_target_only(target, stacked) == []

    # the control: all 8 stacked on this kernel would not be target-only decoding
    forced = _verdicts(target, 8, wire.Sampling(), force=Batching(STACKED, 8, "forced"))
    assert _differs_from_target_only(target, forced)


def test_a_block_variant_linear_fails_the_batch_check_and_the_cloud_falls_back(block_variant_linear):
    target, _ = model_pair(noise=0.05)
    target.name += "-block-variant"  # its own verdict, never the engine's cached one
    report = check_invariance(target, stacked_blocks=8)
    assert report.passed and report.stacked_equal is False, report.summary()
    assert "a call of 2 stacked blocks: request 0's row 0 differs" in report.stacked_difference

    fallback = _verdicts(target, 8, wire.Sampling())
    assert fallback.batching["mode"] == PER_REQUEST and fallback.counters.wide_calls == 0
    assert fallback.batching["why"].startswith("self-test batch check FAILED: a call of 2 stacked blocks")
    line = Batching(**fallback.batching).line()  # what `serve cloud` prints in its ready line
    assert line.startswith("batching per-request: self-test batch check FAILED")
    assert _differs_from_target_only(target, fallback) == [] and _greedy_as_target_only(target, fallback)

    # the control: stacking forced on this kernel would not be target-only decoding
    forced = _verdicts(target, 8, wire.Sampling(), force=Batching(STACKED, 8, "forced"))
    assert forced.counters.wide_calls > 0 and _differs_from_target_only(target, forced)


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
