"""The fixed-shape engine against implementations it shares no code with: transformers' `generate`
and forward for Qwen2.5-Coder 0.5B, CTranslate2 for Whisper base. Self-consistency (every method
equal to target-only) cannot see an engine that is consistently the wrong model; these can. Each
comes with that engine as its negative control: the rotary sine flipped past position 64 (a second
prompt block), Whisper's positional embedding frozen past position 40."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.base import DecodeRequest
from conftest import requires_qwen_05b, tiny_causal

NEW_TOKENS = 24
NEAR_TIE = 1e-3  # fp32: a position where transformers' top-2 logits are closer may go either way
# measured on a 2-core EPYC: bf16 engine against fp32 transformers 0.26 at most (logits up to
# 32.5); the flipped-sine engine 25.4. fp32 Whisper against CTranslate2 float32 1.1e-4; frozen 12.1.
QWEN_BF16_LOGIT_BOUND = 1.0
WHISPER_FP32_LOGIT_BOUND = 1e-2
WHISPER_BF16_LOGIT_BOUND = 1.5  # measured 0.85 on a 2-core AVX2-only EPYC (bf16 emulated); frozen 12.4


def flip_sine_past(forward, position: int) -> None:
    """The deliberately wrong causal engine: rotary sine negated at every position >= `position`."""
    table = type(forward)._rotary_table

    def flipped(self, slots):
        cos, sin = table(self, slots)
        sin = sin.clone()
        sin[position:] = -sin[position:]
        return cos, sin

    forward._rotary_table = flipped.__get__(forward)


def first_real_difference(
    ours: list[int], theirs: list[int], logits: torch.Tensor, near_tie: float = NEAR_TIE
) -> tuple[int, float] | None:
    """(position, the reference's top-2 margin there) of the first differing token whose margin is at
    least `near_tie`; None when the outputs agree up to a near-tie (after which they may diverge)."""
    for position, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        if mine != reference:
            top = logits[position].topk(2).values
            margin = float(top[0] - top[1])
            return None if margin < near_tie else (position, margin)
    return None


@pytest.fixture(scope="module")
def qwen_prompt():
    from asyncspec.benchmarks.humaneval import humaneval_prompts

    (prompt,) = humaneval_prompts(1)
    return prompt


def generate_greedy(model, ids: list[int], tokens: int) -> tuple[list[int], torch.Tensor]:
    prompt = torch.tensor([ids])
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),  # else every id equal to pad_token_id is masked out
        max_new_tokens=tokens,
        do_sample=False,
        repetition_penalty=1.0,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out.sequences[0, len(ids) :].tolist(), torch.cat(out.logits).float()


@pytest.mark.qwen
@requires_qwen_05b
def test_qwen_fp32_greedy_equals_transformers_generate_past_one_prompt_block(qwen_05b_fp32, qwen_prompt, monkeypatch):
    decoder = qwen_05b_fp32
    monkeypatch.setattr(decoder, "eos_ids", frozenset())  # every position compared
    ids = decoder.tokenizer.encode(qwen_prompt)
    assert len(ids) > 64  # the prompt spans two 64-row prefill blocks
    theirs, logits = generate_greedy(decoder.model, ids, NEW_TOKENS)
    request = DecodeRequest(tuple(ids), max_new_tokens=NEW_TOKENS)
    ours = decode_target_only(decoder, None, request).tokens
    margins = (logits.topk(2).values[:, 0] - logits.topk(2).values[:, 1]).tolist()
    near_ties = [(i, round(m, 5)) for i, m in enumerate(margins) if m < NEAR_TIE]
    print(f"smallest top-2 margin {min(margins):.4f}; near-ties: {near_ties or 'none'}")
    assert first_real_difference(ours, theirs, logits) is None, (ours, theirs)

    flip_sine_past(decoder.engine.forward, 64)  # the control: consistently the wrong model
    try:
        wrong = decode_target_only(decoder, None, request).tokens
    finally:
        del decoder.engine.forward._rotary_table
    assert first_real_difference(wrong, theirs, logits) is not None


def forced_logits(decoder, request: DecodeRequest, continuation: list[int]) -> torch.Tensor:
    """The engine's logits at every position of `continuation` after the request's prompt (teacher-forced)."""
    state = decoder.prefill(request)
    first = state.next_logits.float().reshape(1, -1)  # read before `extend` moves it on
    rows = decoder.extend(state, continuation[:-1]).float().reshape(len(continuation) - 1, -1)
    return torch.cat([first, rows])


@pytest.mark.qwen
@requires_qwen_05b
def test_qwen_bf16_logits_stay_near_transformers_fp32(qwen_05b_fp32, qwen_prompt):
    from asyncspec.models.registry import load_decoder

    reference = qwen_05b_fp32.model  # transformers' Qwen2ForCausalLM, fp32
    decoder = load_decoder("qwen2.5-coder-0.5b", "bf16")
    ids = decoder.tokenizer.encode(qwen_prompt)
    continuation, _ = generate_greedy(reference, ids, NEW_TOKENS)
    with torch.inference_mode():
        truth = reference(torch.tensor([ids + continuation])).logits[0, len(ids) - 1 : -1].float()
    request = DecodeRequest(tuple(ids), max_new_tokens=NEW_TOKENS)
    gap = float((forced_logits(decoder, request, continuation) - truth).abs().max())
    print(f"bf16 engine against fp32 transformers: max |logit difference| {gap:.3f}")
    assert gap <= QWEN_BF16_LOGIT_BOUND

    flip_sine_past(decoder.engine.forward, 64)
    assert float((forced_logits(decoder, request, continuation) - truth).abs().max()) > 10 * QWEN_BF16_LOGIT_BOUND


@pytest.fixture(scope="module")
def whisper_window():
    """89 tokens of real speech (librivox-25s, far past position 40): the samples, and CTranslate2
    float32's greedy tokens with its logits at every step."""
    import ctranslate2

    from asyncspec.benchmarks.e2e_systems import ct2_directory
    from asyncspec.data.windows import librivox_windows
    from asyncspec.models.log_mel import log_mel_tensor
    from asyncspec.models.registry import load_decoder

    samples = next(s for dataset, _, s in librivox_windows() if dataset == "librivox-25s")
    prompt = load_decoder("whisper-base", torch.float32, encoder="fp32").request(samples).prompt_ids
    ct2 = ctranslate2.models.Whisper(str(ct2_directory("whisper-base")), device="cpu", compute_type="float32")
    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(log_mel_tensor(samples, 80).numpy()))
    result = ct2.generate(features, [list(prompt)], beam_size=1, return_logits_vocab=True)[0]
    steps = torch.stack([torch.as_tensor(np.asarray(step)).reshape(-1) for step in result.logits[0]]).float()
    assert len(result.sequences_ids[0]) > 60
    return samples, result.sequences_ids[0], steps


def ct2_gap(decoder, request: DecodeRequest, theirs: list[int], steps: torch.Tensor) -> float:
    """Max |logit difference| over CTranslate2's tokens, its suppressed entries (-3.4e38) left out."""
    ours = forced_logits(decoder, request, theirs)
    kept = torch.isfinite(ours) & (steps[: len(theirs)] > -1e30)
    return float(torch.where(kept, (ours - steps[: len(theirs)]).abs(), torch.zeros(())).max())


@pytest.mark.real
@pytest.mark.parametrize(
    ("dtype", "encoder", "bound", "control_above"),
    [
        (torch.float32, "fp32", WHISPER_FP32_LOGIT_BOUND, 100 * WHISPER_FP32_LOGIT_BOUND),
        (torch.bfloat16, "bf16", WHISPER_BF16_LOGIT_BOUND, 5 * WHISPER_BF16_LOGIT_BOUND),
    ],
    ids=["fp32", "bf16"],
)
def test_whisper_tokens_and_logits_match_ctranslate2_on_a_25_s_window(
    whisper_window, dtype, encoder, bound, control_above
):
    """The engine's greedy tokens equal CTranslate2 float32's (in bf16: up to a position where
    CTranslate2's own top-2 margin is below the bf16 bound), and its logits at every step of
    CTranslate2's tokens stay within `bound`; positions frozen past 40 break the bound."""
    from asyncspec.models.registry import load_decoder

    samples, theirs, steps = whisper_window
    decoder = load_decoder("whisper-base", dtype, encoder=encoder)
    request = decoder.request(samples)
    ours = decode_target_only(decoder, None, request).tokens
    if dtype == torch.float32:
        assert ours == theirs
    else:
        assert first_real_difference(ours, theirs, steps, near_tie=bound) is None
    measured = ct2_gap(decoder, request, theirs, steps)
    print(f"{encoder} engine against CTranslate2 float32: max |logit difference| {measured:.2e}")
    assert measured <= bound
    decoder.engine.forward.last_position = 40  # the control: positions past 40 all read the 40th
    control = ct2_gap(decoder, request, theirs, steps)
    print(f"{encoder} engine, positions frozen past 40: max |logit difference| {control:.2f}")
    assert control > control_above


TINY_FP32_LOGIT_BOUND = 1e-4  # measured: 2e-6 at most on a 2-core EPYC


@pytest.mark.parametrize("layout", ["qwen2", "qwen3", "llama"])
def test_tiny_layouts_equal_transformers_past_one_prompt_block(layout, monkeypatch):
    """Every layout forward_causal.py writes, against transformers' own model of it: greedy tokens
    equal to `generate` (up to a near-tie) and teacher-forced logits within TINY_FP32_LOGIT_BOUND,
    over an 80-token prompt (two 64-row prefill blocks); the flipped-sine engine fails the bound."""
    decoder = tiny_causal(torch.float32, seed=31, layout=layout, init_std=0.2)
    monkeypatch.setattr(decoder, "eos_ids", frozenset())
    ids = torch.randint(0, decoder.vocab_size - 1, (80,), generator=torch.Generator().manual_seed(31)).tolist()
    theirs, logits = generate_greedy(decoder.model, ids, NEW_TOKENS)
    request = DecodeRequest(tuple(ids), max_new_tokens=NEW_TOKENS)
    assert first_real_difference(decode_target_only(decoder, None, request).tokens, theirs, logits) is None
    with torch.inference_mode():
        truth = decoder.model(torch.tensor([ids + theirs])).logits[0, len(ids) - 1 : -1].float()
    gap = float((forced_logits(decoder, request, theirs) - truth).abs().max())
    print(f"{layout}: max |logit difference| {gap:.2e}")
    assert gap <= TINY_FP32_LOGIT_BOUND

    flip_sine_past(decoder.engine.forward, 64)
    assert float((forced_logits(decoder, request, theirs) - truth).abs().max()) > 100 * TINY_FP32_LOGIT_BOUND
