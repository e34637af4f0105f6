"""Target-only decoding: equal to transformers' own greedy generate; seeded sampling reproducible."""

from __future__ import annotations

import torch

from asyncspec.decoding.result import DecodeConfig
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.models.base import DecodeRequest
from conftest import tiny_causal


def test_greedy_equals_transformers_generate():
    decoder = tiny_causal(torch.float32, seed=3)
    decoder.eos_ids = frozenset()  # run to the length limit so every step is compared
    prompt = [5, 17, 42, 8]
    result = decode_target_only(decoder, None, DecodeRequest(prompt_ids=tuple(prompt), max_new_tokens=24))
    expected = decoder.model.generate(
        torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(prompt) :].tolist()
    assert result.tokens == expected
    assert result.stats.finish_reason == "length"
    assert result.stats.target_calls == 23 and result.stats.call_widths == [1] * 23


def test_sampling_is_reproducible_per_seed():
    decoder = tiny_causal(torch.float32, seed=4)
    request = DecodeRequest(prompt_ids=(1, 2, 3), max_new_tokens=16)
    runs = [decode_target_only(decoder, None, request, DecodeConfig(temperature=1.0, seed=s)).tokens for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stops_at_end_of_sequence_without_emitting_it():
    decoder = tiny_causal(torch.float32, seed=5)
    request = DecodeRequest(prompt_ids=(1, 2, 3), max_new_tokens=30)
    free = decode_target_only(decoder, None, request).tokens
    decoder.eos_ids = frozenset({free[4]})
    stopped = decode_target_only(decoder, None, request)
    assert stopped.tokens == free[: free.index(free[4])]
    assert stopped.stats.finish_reason == "eos"
