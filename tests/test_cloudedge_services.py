"""The cloud verifier and the edge gateway over real ZeroMQ sockets on loopback (services in
threads of this process; the process-level tests are in test_cloudedge_process.py)."""

from __future__ import annotations

import random

import pytest
import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud import CloudConfig
from asyncspec.cloudedge.correction import CorrectionPolicy
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.base import DecodeRequest
from cloudedge_support import model_pair, open_block_violations, run_requests, services
from frame_proxy import FrameProxyConfig

PROMPT = [3, 4, 5]
POLICY = EdgePolicy(block_size=6, dead_after_s=2.0, give_up_s=30.0)
SAMPLING_POLICY = EdgePolicy(block_size=3, correction=CorrectionPolicy(k_schedule=(4, 16, 64), proposals=16))
# the same without proposals in the rejecting verdict: a rejection starts at the top-K support, so a
# budget is spent on bounded draws (with proposals attached, exact recovery settles nearly every one first)
TOPK_FIRST_POLICY = EdgePolicy(
    block_size=3, correction=CorrectionPolicy(k_schedule=(4, 16, 64), proposals=16, verdict_proposals=0)
)


@pytest.fixture(scope="module")
def greedy_pair():
    return model_pair(noise=0.05)


@pytest.fixture(scope="module")
def sampling_pair():
    return model_pair(noise=0.3)


def workload(n: int = 32, seed: int = 1) -> tuple[list[list[int]], list[int]]:
    generator = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(0, 95, (int(k),), generator=generator).tolist()
        for k in torch.randint(1, 12, (n,), generator=generator)
    ]
    lengths = [int(k) for k in torch.randint(1, 40, (n,), generator=generator)]
    return prompts, lengths


def target_only(target, prompts, lengths) -> list[list[int]]:
    return [
        decode_target_only(target, None, DecodeRequest(tuple(p), max_new_tokens=n)).tokens
        for p, n in zip(prompts, lengths, strict=True)
    ]


def test_greedy_32_concurrent_requests_equal_target_only_and_never_two_open_blocks(greedy_pair):
    target, drafter = greedy_pair
    prompts, lengths = workload()
    with services(target, drafter, POLICY, CloudConfig(batch_wait_s=0.005), link=FrameProxyConfig(latency_s=0.002)) as (
        gateway,
        cloud,
        link,
    ):
        results = run_requests(gateway, prompts, lengths)
        frames = link.record.snapshot()
    assert [r["type"] for r in results] == ["done"] * 32
    assert [r["tokens"] for r in results] == target_only(target, prompts, lengths)
    assert open_block_violations(frames) == []
    counters = cloud.counters
    assert counters.largest_batch >= 2  # blocks of several requests verified in one forward
    drafted = sum(r["stats"]["drafted"] for r in results)
    accepted = sum(r["stats"]["accepted"] for r in results)
    assert 0 < accepted < drafted  # both the acceptance and the rejection path were taken
    assert all(
        r["stats"]["ttft_s"] is not None and len(r["stats"]["token_times_s"]) == len(r["tokens"]) for r in results
    )


def test_the_open_block_check_catches_runahead():
    """The checker above can fail: a second block before the first one's verdict is reported."""
    config = wire.Sampling().digest()

    def block(base):
        return ("up", 0.0, wire.encode(wire.Block(wire.BlockId(7, base, 1, config), 1, wire.pack_ids([2]), b"")))

    verdict = ("down", 0.0, wire.encode(wire.Verdict(wire.BlockId(7, 10, 1, config), 0, 5)))
    assert open_block_violations([block(10), verdict, block(11)]) == []
    assert open_block_violations([block(10), block(12), verdict]) != []  # drafted from an unconfirmed prefix
    assert open_block_violations([block(10), verdict, block(12)]) != []  # not the confirmed prefix


def noise_floor(law: torch.Tensor, draws: int) -> float:
    """Three times the expected TV of an empirical distribution of `draws` samples from `law`."""
    law = law.double()
    return 3 * 0.5 * float(torch.sqrt(2 * law * (1 - law) / (torch.pi * draws)).sum())


def first_token_law(target) -> torch.Tensor:
    state = target.prefill(DecodeRequest(tuple(PROMPT)))
    return torch.softmax(state.next_logits, dim=-1)


def sample_first_tokens(pair, eps_req: float, draws: int, policy=SAMPLING_POLICY) -> tuple[torch.Tensor, list[dict]]:
    target, drafter = pair
    samplings = [wire.Sampling(1.0, seed) for seed in range(draws)]
    with services(target, drafter, policy) as (gateway, _, _):
        results = run_requests(gateway, [PROMPT] * draws, 2, samplings, eps_req=eps_req, timeout=300)
    counts = torch.zeros(target.vocab_size)
    for result in results:
        assert result["type"] == "done"
        counts[result["tokens"][0] if result["tokens"] else target.vocab_size - 1] += 1
    return counts / draws, results


def modes(results) -> dict:
    total = {"topk": 0, "exact": 0, "full": 0, "eps_max": 0.0}
    for result in results:
        corrections = result["stats"]["corrections"]
        total["topk"] += sum(corrections["topk"].values())
        total["exact"] += corrections["exact"]
        total["full"] += corrections["full"]
        total["eps_max"] = max(total["eps_max"], corrections["eps_charged"])
    return total


def test_zero_budget_sampling_follows_the_target_distribution(sampling_pair):
    draws = 1000
    law, results = sample_first_tokens(sampling_pair, 0.0, draws)
    p = first_token_law(sampling_pair[0])
    assert 0.5 * (law - p).abs().sum().item() < noise_floor(p, draws)
    counted = modes(results)
    assert counted["topk"] == 0 and counted["eps_max"] == 0.0  # every correction exact
    assert counted["exact"] > 0


def test_bounded_sampling_stays_within_the_certified_budget(sampling_pair):
    draws = 1000
    eps_req = 0.05
    law, results = sample_first_tokens(sampling_pair, eps_req, draws, TOPK_FIRST_POLICY)
    p = first_token_law(sampling_pair[0])
    counted = modes(results)
    assert counted["topk"] > 0  # bounded corrections happened (K expanded until certified)
    assert counted["eps_max"] <= eps_req
    assert 0.5 * (law - p).abs().sum().item() <= eps_req + noise_floor(p, draws)
    assert any(r["stats"]["corrections"]["queries"] > 0 for r in results)  # K grew beyond the first support


def test_uplink_bytes_per_candidate(sampling_pair):
    """Compact uplink (id + q) vs the full draft distribution (4·|V| B per position)."""
    target, drafter = sampling_pair
    prompts, lengths = workload(8, seed=2)
    samplings = [wire.Sampling(1.0, s) for s in range(8)]
    with services(target, drafter, EdgePolicy(block_size=7)) as (gateway, _, _):
        compact = run_requests(gateway, prompts, [40] * 8, samplings)
    with services(target, drafter, EdgePolicy(block_size=7, uplink="full")) as (gateway, _, _):
        full = run_requests(gateway, prompts, [40] * 8, samplings)
    per_candidate = sum(r["stats"]["block_bytes"] for r in compact) / sum(r["stats"]["drafted"] for r in compact)
    full_per_candidate = sum(r["stats"]["block_bytes"] for r in full) / sum(r["stats"]["drafted"] for r in full)
    print(f"uplink per drafted candidate: compact {per_candidate:.1f} B, full distribution {full_per_candidate:.1f} B")
    assert per_candidate <= 16
    assert full_per_candidate >= 4 * target.vocab_size


def _faults(seed: int = 0):
    """Duplicate every frame, delay a third of them (reordering), replay old blocks late, and
    inject malformed frames in both directions."""
    rng = random.Random(seed)
    seen_blocks: list[bytes] = []

    def fault(direction, frame, now):
        deliveries = [(0.0, frame), (rng.uniform(0, 0.02), frame)]
        if rng.random() < 0.3:
            deliveries = [(rng.uniform(0.005, 0.03), f) for _, f in deliveries]
        if direction == "up" and frame[1:2] == bytes([wire.Block.code]) or rng.random() < 0.05:
            seen_blocks.append(frame)
        if direction == "up" and len(seen_blocks) > 5 and rng.random() < 0.2:
            deliveries.append((0.0, seen_blocks[rng.randrange(len(seen_blocks) - 3)]))  # a stale block
        if rng.random() < 0.05:
            deliveries.append((0.0, b"\x93\x01garbage" + bytes(rng.randrange(256) for _ in range(8))))
        return deliveries

    return fault


def test_duplicated_delayed_stale_and_malformed_messages(greedy_pair):
    target, drafter = greedy_pair
    prompts, lengths = workload(16, seed=3)
    with services(target, drafter, POLICY, link=(FrameProxyConfig(), _faults())) as (gateway, cloud, _):
        results = run_requests(gateway, prompts, lengths)
        edge_counters, cloud_counters = gateway.summary(), cloud.summary()
    assert [r["tokens"] for r in results] == target_only(target, prompts, lengths)
    assert cloud_counters["cloud"]["answered_from_cache"] + cloud_counters["cloud"]["duplicate_in_queue"] > 0
    assert edge_counters["edge"]["stale_replies"] > 0
    assert cloud_counters["traffic"]["malformed"] > 0 and edge_counters["traffic"]["malformed"] > 0


def test_sampled_decisions_are_not_redrawn_under_duplicates(sampling_pair):
    """Seeded sampling is reproducible, and duplicated / delayed / stale frames change nothing:
    decisions are answered from the cache, never sampled again."""
    target, drafter = sampling_pair
    prompts, _ = workload(12, seed=4)
    samplings = [wire.Sampling(1.0, s) for s in range(12)]
    with services(target, drafter, SAMPLING_POLICY) as (gateway, _, _):
        clean = run_requests(gateway, prompts, 20, samplings)
    with services(target, drafter, SAMPLING_POLICY, link=(FrameProxyConfig(), _faults(1))) as (gateway, cloud, _):
        faulty = run_requests(gateway, prompts, 20, samplings)
        assert cloud.counters.answered_from_cache + cloud.counters.duplicate_in_queue > 0
    assert [r["tokens"] for r in faulty] == [r["tokens"] for r in clean]


def test_a_full_cloud_queue_pushes_back_and_nothing_is_lost(greedy_pair):
    target, drafter = greedy_pair
    prompts, lengths = workload(12, seed=6)
    with services(target, drafter, POLICY, CloudConfig(max_queue=1, batch_wait_s=0.01)) as (gateway, cloud, _):
        results = run_requests(gateway, prompts, lengths)
    assert cloud.counters.nacks["busy"] > 0
    assert [r["tokens"] for r in results] == target_only(target, prompts, lengths)


def test_head_agrees_tail_residual_through_the_services(sampling_pair):
    """p and q agree on p's top 8 (its head) while the residual lies in the tail: the top-8
    certificate is loose although coverage is high, so the edge expands K or goes exact; the
    corrections land in the head only as often as the exact residual says (Z_S / Z), where
    trusting top-8 coverage would put every correction there."""
    from asyncspec.verify import tv_certificate
    from cloudedge_support import ShapedDrafter, head_agrees_tail_residual

    target, _ = sampling_pair
    p = first_token_law(target)
    q = head_agrees_tail_residual(p)
    head = torch.argsort(p, descending=True)[:8]
    coverage = float(p[head].sum())
    z_head, eps_top8 = tv_certificate(p[head], q[head], 1 - coverage)
    assert coverage > 0.75 and eps_top8 > 0.5  # high coverage, loose certificate
    eps_req, draws = 0.05, 1500
    policy = EdgePolicy(block_size=1, correction=CorrectionPolicy(k_schedule=(8, 16, 32), proposals=16))
    samplings = [wire.Sampling(1.0, seed) for seed in range(draws)]
    with services(target, ShapedDrafter(target, head_agrees_tail_residual), policy) as (gateway, _, _):
        results = run_requests(gateway, [PROMPT] * draws, 2, samplings, eps_req=eps_req, timeout=300)
    corrected = [r for r in results if r["stats"]["drafted"] and r["stats"]["accepted"] == 0]
    in_head = sum(r["tokens"][0] in set(head.tolist()) for r in corrected) / len(corrected)
    z_total = float(torch.clamp(p - q, min=0).sum())
    expected = z_head / z_total  # the exact residual's mass on the head
    sigma = (expected * (1 - expected) / len(corrected)) ** 0.5
    assert len(corrected) > 50
    assert abs(in_head - expected) <= 4 * sigma + eps_req
    assert all(r["stats"]["corrections"]["eps_charged"] <= eps_req for r in results)
    assert not any(r["stats"]["corrections"]["topk"].get("8") for r in results)  # top-8 was never trusted
    law = torch.zeros(target.vocab_size)
    for result in results:
        law[result["tokens"][0]] += 1 / draws
    assert 0.5 * (law - p).abs().sum().item() <= eps_req + noise_floor(p, draws)


def _drop_first_verdicts():
    """Drop every Verdict the first time it crosses the link (a lost frame; the cloud stays alive)."""
    seen: set[bytes] = set()

    def fault(direction, frame, now):
        if direction == "down" and frame[1:2] == bytes([wire.Verdict.code]) and frame not in seen:
            seen.add(frame)
            return []
        return [(0.0, frame)]

    return fault


def test_lost_verdicts_are_recovered_by_retransmission(greedy_pair):
    """The cloud stays alive (pongs flow), but every first verdict is lost: the edge resends the
    unanswered block after dead_after_s and the cloud answers it from its decision cache."""
    target, drafter = greedy_pair
    prompts, lengths = workload(8, seed=8)
    policy = EdgePolicy(block_size=4, dead_after_s=0.2, heartbeat_s=0.05, give_up_s=60)
    with services(target, drafter, policy, link=(FrameProxyConfig(), _drop_first_verdicts())) as (gateway, cloud, _):
        results = run_requests(gateway, prompts, lengths, timeout=120)
    assert [r["tokens"] for r in results] == target_only(target, prompts, lengths)
    assert gateway.counters.resubmitted_blocks > 0 and cloud.counters.answered_from_cache > 0
