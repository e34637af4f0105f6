"""The decoder interface: K-token extends equal K one-token extends, and rollback is exact.

On the fixed-shape engine (every target) "equal" means bitwise: logits and KV. On the
transformers engine (drafters only) a many-token call rounds differently from one-token calls."""

from __future__ import annotations

import pytest
import torch

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.models.base import DecodeRequest
from asyncspec.models.row_probe import kv_rows
from conftest import REAL_DTYPE, requires_qwen_05b, synthetic_speech, tiny_causal, tiny_whisper

# The transformers engine's agreement between one many-token call and many one-token calls: exact
# math in fp32 up to summation order; bf16 rounds each layer's output to 8 significant bits.
TRANSFORMERS_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.35}


def tolerance(decoder, dtype) -> float:
    return 0.0 if decoder.engine_name == "fixed-shape" else TRANSFORMERS_TOLERANCE[dtype]


def _single_steps(decoder, request, tokens):
    state = decoder.prefill(request)
    return torch.stack([decoder.extend(state, [t])[0] for t in tokens]), state


def assert_extend_matches_single_steps(decoder, request, tokens, dtype):
    batched_state = decoder.prefill(request)
    batched = decoder.extend(batched_state, tokens)
    single, single_state = _single_steps(decoder, request, tokens)
    assert batched.shape == (len(tokens), decoder.vocab_size)
    assert batched.dtype == torch.float32
    assert decoder.greedy(batched) == decoder.greedy(single)
    assert max_logit_difference(batched, single) <= tolerance(decoder, dtype)
    assert batched_state.tokens == single_state.tokens
    if decoder.engine_name == "fixed-shape":
        assert torch.equal(batched, single)
        for mine, theirs in zip(kv_rows(batched_state), kv_rows(single_state), strict=True):
            assert torch.equal(mine, theirs)


def assert_rollback_is_exact(decoder, request, tokens, dtype):
    """Extend, roll back, extend other tokens: equal to a fresh state that never saw the dropped ones."""
    keep = len(tokens) // 2
    state = decoder.prefill(request)
    decoder.extend(state, tokens)
    decoder.rollback(state, state.prompt_len + keep)
    assert state.length == state.prompt_len + keep
    assert decoder.cache_length(state) == state.length
    assert state.next_logits is None
    replacement = [(t + 7) % (decoder.vocab_size - 1) for t in tokens[keep:]]
    after_rollback = decoder.extend(state, replacement)
    fresh = decoder.prefill(request)
    decoder.extend(fresh, tokens[:keep])
    expected = decoder.extend(fresh, replacement)
    # Bitwise on the fixed-shape engine; a surviving dropped token would shift far more.
    assert max_logit_difference(after_rollback, expected) <= tolerance(decoder, dtype)
    assert decoder.greedy(after_rollback) == decoder.greedy(expected)


def max_logit_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over finite entries; suppressed (-inf) entries must coincide."""
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    return (a[finite] - b[finite]).abs().max().item()


@pytest.mark.parametrize("engine", ["fixed-shape", "transformers"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiny_causal_extend_and_rollback(dtype, seed, engine):
    decoder = tiny_causal(dtype, seed, engine=engine)
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 90, (7,), generator=generator).tolist()
    tokens = torch.randint(0, 90, (9,), generator=generator).tolist()
    request = DecodeRequest(prompt_ids=tuple(prompt))
    assert_extend_matches_single_steps(decoder, request, tokens, dtype)
    assert_rollback_is_exact(decoder, request, tokens, dtype)


@pytest.mark.parametrize("engine", ["fixed-shape", "transformers"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_whisper_extend_and_rollback(dtype, engine):
    decoder = tiny_whisper(dtype, engine=engine)
    request = decoder.request(synthetic_speech())
    tokens = [1000 + 37 * i for i in range(8)]
    assert_extend_matches_single_steps(decoder, request, tokens, dtype)
    assert_rollback_is_exact(decoder, request, tokens, dtype)


def test_rollback_rejects_lengths_outside_the_state():
    decoder = tiny_causal()
    state = decoder.prefill(DecodeRequest(prompt_ids=(1, 2, 3)))
    with pytest.raises(ValueError):
        decoder.rollback(state, 4)
    with pytest.raises(ValueError):
        decoder.rollback(state, 0)


def test_extend_rejects_out_of_vocabulary_and_overlong_input():
    decoder = tiny_causal()
    state = decoder.prefill(DecodeRequest(prompt_ids=(1, 2, 3)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decoder.extend(state, [decoder.vocab_size])
    with pytest.raises(ValueError, match="exceed"):
        decoder.extend(state, [1] * decoder.max_length)
    assert state.length == 3


def test_whisper_suppression_masks_the_first_output_position_only():
    decoder = tiny_whisper()
    state = decoder.prefill(decoder.request(synthetic_speech()))
    eot = next(iter(decoder.eos_ids))
    assert state.next_logits[eot] == float("-inf")  # no immediate end of text
    assert state.next_logits[220] == float("-inf")  # no leading blank
    later = decoder.extend(state, [1000])[0]
    assert torch.isfinite(later[eot]) and torch.isfinite(later[220])
    assert later[7] == float("-inf")  # always-suppressed ids stay suppressed


@pytest.mark.real
def test_real_whisper_base_extend_and_rollback(whisper_base):
    decoder = whisper_base
    clip = librivox_clips()[0]
    request = decoder.request(load_audio(clip.path))
    tokens = decoder.tokenizer.encode(" And Mr. John Dashwood had then leisure to consider")
    assert_extend_matches_single_steps(decoder, request, tokens, decoder.dtype)
    assert_rollback_is_exact(decoder, request, tokens, decoder.dtype)


@pytest.mark.qwen
@requires_qwen_05b
def test_real_qwen_05b_extend_and_rollback():
    from asyncspec.models.offline import prepare
    from asyncspec.models.registry import load_decoder

    prepare("qwen2.5-coder-0.5b")
    decoder = load_decoder("qwen2.5-coder-0.5b", REAL_DTYPE)
    request = decoder.request("def fibonacci(n):\n    ")
    tokens = decoder.tokenizer.encode('"""Return the n-th Fibonacci number."""\n    if n < 2:')
    assert_extend_matches_single_steps(decoder, request, tokens, decoder.dtype)
    assert_rollback_is_exact(decoder, request, tokens, decoder.dtype)
