"""Greedy exactness of the serial speculative methods, and SpecASR's recycling."""

from __future__ import annotations

import pytest
import torch

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.decoding.drafter import DrafterCounters, PrefixDrafter, Proposal
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.decoding.specasr import AdaptiveRecyclingSource, Rejection, realign
from asyncspec.decoding.speculative import speculative_decode
from asyncspec.errors import InputError
from asyncspec.models.base import DecodeRequest
from conftest import REAL_DTYPE, requires_qwen_pair, synthetic_speech, tiny_causal, tiny_whisper

SPECULATIVE = ["sd", "specasr"]


def _assert_equal_to_target(target, drafter, request, budgets):
    reference = METHODS["target"](target, None, request, DecodeConfig())
    for method in SPECULATIVE:
        for budget in budgets:
            result = METHODS[method](target, drafter, request, DecodeConfig(budget=budget))
            assert result.tokens == reference.tokens, (method, budget)
            assert result.stats.finish_reason == reference.stats.finish_reason
            assert max(result.stats.call_widths) <= budget + 1
    return reference


@pytest.mark.parametrize("seed", range(6))
def test_never_agreeing_drafter_keeps_target_output(seed):
    target, drafter = tiny_causal(seed=seed), tiny_causal(seed=100 + seed)
    prompt = tuple(torch.randint(0, 90, (5,), generator=torch.Generator().manual_seed(seed)).tolist())
    _assert_equal_to_target(target, drafter, DecodeRequest(prompt, max_new_tokens=40), budgets=[1, 2, 5, 24])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_identical_drafter_is_fully_accepted(dtype):
    target, drafter = tiny_causal(dtype, seed=3), tiny_causal(dtype, seed=3)
    target.eos_ids = drafter.eos_ids = frozenset()
    request = DecodeRequest((4, 8, 15), max_new_tokens=33)
    _assert_equal_to_target(target, drafter, request, budgets=[1, 4, 8])
    result = METHODS["sd"](target, drafter, request, DecodeConfig(budget=4))
    assert result.stats.acceptance == 1.0
    assert result.stats.target_calls == 7  # 1 + 4 candidates per call: 33 tokens in ceil(32 / 5) calls


def test_whisper_same_and_converted_vocabulary():
    audio = synthetic_speech(4.0)
    target = tiny_whisper(seed=0, multilingual=True)
    request = target.request(audio, max_new_tokens=30)
    for drafter in (tiny_whisper(seed=1, multilingual=True), tiny_whisper(seed=0), tiny_whisper(seed=2)):
        assert PrefixDrafter(drafter, target).converts == (drafter.vocab_size != target.vocab_size)
        _assert_equal_to_target(target, drafter, request, budgets=[2, 7])


def test_sampling_sd_is_reproducible_and_sampling_needs_a_same_vocabulary_drafter():
    target, drafter = tiny_causal(seed=1), tiny_causal(seed=1)
    request = DecodeRequest((1, 2, 3), max_new_tokens=20)
    config = DecodeConfig(temperature=0.8, seed=5)
    first = METHODS["sd"](target, drafter, request, config)
    assert first.tokens == METHODS["sd"](target, drafter, request, config).tokens
    assert first.stats.acceptance > 0.5  # identical models: p = q, every candidate accepted
    whisper_target = tiny_whisper(multilingual=True)
    with pytest.raises(InputError, match="vocabulary"):
        METHODS["sd"](whisper_target, tiny_whisper(), whisper_target.request(synthetic_speech()), config)


def test_realign_same_and_adjacent_positions():
    rejection = Rejection(rejected=10, remainder=[11, 12, 13], correction=99)
    assert realign(11, rejection) == [12, 13]  # substitution: the remainder continues
    assert realign(10, rejection) == [11, 12, 13]  # the target inserted a token before 10
    assert realign(12, Rejection(10, [99, 12, 13], correction=99)) == [13]  # 10 was an extra token
    assert realign(55, rejection) == []


class _ScriptedDrafter:
    """A drafter that reads its next tokens off a fixed script, one forward call per token."""

    def __init__(self, script: list[int], target):
        self.script, self.target, self.counters = script, target, DrafterCounters()

    def start(self, request):
        pass

    def propose(self, prefix, max_tokens, min_confidence=None, temperature=0.0, generator=None):
        tokens = self.script[len(prefix) : len(prefix) + max_tokens]
        self.counters.calls += len(tokens)
        return Proposal(tokens, [1.0] * len(tokens), None, len(tokens))


def _recycling_run(script, truth_request, target, recycle=True):
    source = AdaptiveRecyclingSource(_ScriptedDrafter(script, target), cap=8, recycle=recycle)
    return speculative_decode("specasr", target, source, truth_request, DecodeConfig(), 8)


def _no_eos_target(seed):
    target = tiny_causal(seed=seed)
    target.eos_ids = frozenset()
    return target


def test_recycling_reuses_a_realigned_suffix_and_saves_drafter_calls():
    target = _no_eos_target(8)
    request = DecodeRequest((3, 1, 4), max_new_tokens=24)
    truth = METHODS["target"](target, None, request, DecodeConfig()).tokens
    one_substitution = truth[:2] + [(truth[2] + 1) % 90] + truth[3:]
    with_recycling = _recycling_run(one_substitution, request, target)
    without = _recycling_run(one_substitution, request, target, recycle=False)
    assert with_recycling.tokens == without.tokens == truth
    assert with_recycling.stats.recycled > 0
    assert with_recycling.stats.drafter_calls < without.stats.drafter_calls


def test_a_wrongly_realigned_suffix_is_still_rejected():
    target = _no_eos_target(9)
    request = DecodeRequest((2, 7, 1), max_new_tokens=20)
    truth = METHODS["target"](target, None, request, DecodeConfig()).tokens
    garbage = [(t + 5) % 90 for t in truth[3:8]]
    # Rejected at 2; the drafter's next token then matches the old remainder's head, so the
    # (wrong) rest of the remainder is reused and must be rejected by the target.
    script = truth[:2] + [(truth[2] + 1) % 90] + garbage + truth[8:]
    result = _recycling_run(script, request, target)
    assert result.tokens == truth
    assert result.stats.recycled >= 4
    assert result.stats.acceptance < 1.0


@pytest.mark.real
def test_librivox_sd_and_specasr_equal_target_only(whisper_base):
    from asyncspec.models.registry import load_decoder

    drafter = load_decoder("whisper-tiny.en", "bf16")
    for clip in librivox_clips():
        request = whisper_base.request(load_audio(clip.path))
        reference = _assert_equal_to_target(whisper_base, drafter, request, budgets=[7])
        assert len(reference.tokens) > 5


@pytest.mark.qwen
@requires_qwen_pair
def test_humaneval_prompts_with_qwen_pair_equal_target_only(qwen_15b):
    from asyncspec.benchmarks.humaneval import humaneval_prompts
    from asyncspec.models.registry import load_decoder

    target = qwen_15b
    drafter = load_decoder("qwen2.5-coder-0.5b", REAL_DTYPE, engine="transformers")
    # one prompt: the real pair through the services is test_cloudedge_qwen's (each prompt here
    # costs ~30 s of 1.5B calls on a 2-core machine)
    (prompt,) = humaneval_prompts(1)
    _assert_equal_to_target(target, drafter, target.request(prompt, max_new_tokens=32), budgets=[7])
