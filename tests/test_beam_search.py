"""Beam search (decoding/beam_search.py): the beams side by side in one call per step find bitwise
the hypotheses and scores of the same search with each beam in a call of its own; a beam of one is
greedy decoding; and on real Whisper base it finds CTranslate2's own beam search (faster-whisper's
backend, an independent implementation) token for token. Controls: an engine whose rows see each
other breaks the first; greedy decoding differs from CTranslate2's beam 5 on some real window, so
the comparison can tell a beam search from none."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from asyncspec.decoding.beam_search import BeamSearch, decode_beam_search
from asyncspec.decoding.lockstep import one_call_per_row
from asyncspec.decoding.result import DecodeConfig
from asyncspec.decoding.target_only import decode_target_only
from conftest import synthetic_speech, tiny_whisper
from test_target_draws import RowMixingForward


def timed_request(whisper, tokens: int = 40, seed: int = 3):
    audio = synthetic_speech(2.0, seed=seed)
    request = whisper.request(audio, max_new_tokens=tokens, timestamps=True, previous=list(range(400, 420)))
    return replace(request, encoded=whisper.encode_audio(audio))


def same_result(a, b) -> bool:
    return (
        a.tokens == b.tokens
        and a.stats.logprobs == b.stats.logprobs
        and a.stats.finish_reason == b.stats.finish_reason
        and a.stats.notes["hypotheses_finished"] == b.stats.notes["hypotheses_finished"]
    )


def packed_and_alone(whisper, request, config):
    return (
        decode_beam_search(whisper, request, config),
        decode_beam_search(whisper, request, config, calls=one_call_per_row),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
@pytest.mark.parametrize("beam_size", [2, 5, 8])
def test_beams_in_one_call_equal_each_beam_in_a_call_of_its_own(dtype, beam_size):
    whisper = tiny_whisper(dtype, seed=21, peak=12.0)
    request = timed_request(whisper)
    packed, alone = packed_and_alone(whisper, request, DecodeConfig(beam_size=beam_size))
    assert same_result(packed, alone)
    assert max(packed.stats.call_widths) == beam_size  # every beam was a row of the same call
    assert packed.stats.target_calls == alone.stats.target_calls


def test_more_beams_than_a_call_has_rows_split_into_calls_and_stay_equal():
    whisper = tiny_whisper(torch.float32, seed=22, peak=12.0)
    beams = whisper.call_width + 3
    packed, alone = packed_and_alone(whisper, timed_request(whisper, tokens=16), DecodeConfig(beam_size=beams))
    assert max(packed.stats.call_widths) == beams
    assert same_result(packed, alone)


def test_the_comparison_fails_on_an_engine_whose_rows_see_each_other():
    whisper = tiny_whisper(torch.float32, seed=21, peak=12.0)
    request = timed_request(whisper)
    whisper.engine.forward = RowMixingForward(whisper.engine.forward)
    packed, alone = packed_and_alone(whisper, request, DecodeConfig(beam_size=5))
    assert not same_result(packed, alone)


@pytest.mark.parametrize("seed", [21, 23])
def test_a_beam_of_one_is_greedy_decoding(seed):
    whisper = tiny_whisper(torch.float32, seed=seed, peak=12.0)
    request = timed_request(whisper)
    beam = decode_beam_search(whisper, request, DecodeConfig(beam_size=1))
    greedy = decode_target_only(whisper, None, request)
    assert beam.tokens == greedy.tokens
    assert beam.stats.logprobs == greedy.stats.logprobs


def test_a_wider_beam_finds_a_hypothesis_at_least_as_likely_as_greedy():
    """The search's own objective: with a length penalty of 0 (scores unnormalised) and patience
    enough, the kept hypothesis's summed log-probability is never below greedy's."""
    whisper = tiny_whisper(torch.float32, seed=24, peak=12.0)
    request = timed_request(whisper, tokens=30)
    greedy = decode_target_only(whisper, None, request)
    beam = decode_beam_search(whisper, request, DecodeConfig(beam_size=5, length_penalty=0.0, patience=2.0))
    assert sum(beam.stats.logprobs) >= sum(greedy.stats.logprobs)


def test_patience_and_beam_size_are_validated():
    whisper = tiny_whisper(torch.float32, seed=21)
    with pytest.raises(ValueError, match="beam size"):
        BeamSearch(whisper, 0)
    with pytest.raises(ValueError, match="patience"):
        BeamSearch(whisper, 5, patience=0.0)


def test_word_timestamps_record_the_chosen_hypothesis_rows():
    """With an attention sink, a state holding the chosen hypothesis is recorded, and its
    alignment weights are those of the same tokens decoded target-only by extension."""
    from asyncspec.models.attention_record import AttentionSink

    whisper = tiny_whisper(torch.float32, seed=21, peak=12.0)
    request = timed_request(whisper)
    sink = AttentionSink(whisper)
    result = decode_beam_search(whisper, replace(request, attention=sink), DecodeConfig(beam_size=5))
    wanted = [*request.prompt_ids, *result.tokens[:-1]]
    state = sink.state_for(wanted)
    assert state is not None
    reference_sink = AttentionSink(whisper)
    reference = whisper.prefill(replace(request, attention=reference_sink))
    for token in result.tokens[:-1]:
        whisper.extend(reference, [token])
    positions = range(len(wanted))
    assert torch.equal(state.cache.attention.rows(positions), reference.cache.attention.rows(positions))


def ct2_beam(ct2, samples, prompt, beam_size: int) -> list[int]:
    import ctranslate2

    from asyncspec.models.log_mel import log_mel_tensor

    features = ctranslate2.StorageView.from_array(np.ascontiguousarray(log_mel_tensor(samples, 80).numpy()))
    return ct2.generate(features, [list(prompt)], beam_size=beam_size, max_length=448)[0].sequences_ids[0]


@pytest.mark.real
def test_whisper_base_beam_five_equals_ctranslate2_beam_five_on_librivox():
    """Whisper base in fp32 on the engine against CTranslate2 float32 (faster-whisper's backend),
    both at beam 5 with timestamps, on real speech: the same tokens on every window. The control:
    greedy decoding differs from CTranslate2's beam 5 on at least one of them."""
    import ctranslate2

    from asyncspec.benchmarks.e2e_systems import ct2_directory
    from asyncspec.data.windows import librivox_windows
    from asyncspec.models.registry import load_decoder

    decoder = load_decoder("whisper-base", torch.float32, encoder="fp32")
    ct2 = ctranslate2.models.Whisper(str(ct2_directory("whisper-base")), device="cpu", compute_type="float32")
    windows = [samples for dataset, _, samples in librivox_windows() if dataset == "librivox-25s"][:3]
    greedy_differs = False
    for samples in windows:
        request = decoder.request(samples, timestamps=True)
        request = replace(request, encoded=decoder.encode_audio(samples))
        theirs = ct2_beam(ct2, samples, request.prompt_ids, 5)
        assert decode_beam_search(decoder, request, DecodeConfig(beam_size=5)).tokens == theirs
        greedy_differs |= decode_target_only(decoder, None, request).tokens != theirs
    assert greedy_differs


def test_a_state_copied_into_another_decodes_as_a_full_copy_and_the_rows_matter():
    """copy_state_into copies only the rows past the two states' common tokens: the destination then
    decodes bitwise as a full copy of the source would. The control: the tokens alone moved
    over, without the rows, give other logits (the copied rows are what the next call reads)."""
    whisper = tiny_whisper(torch.float32, seed=21, peak=12.0)
    request = timed_request(whisper)
    source = whisper.prefill(request)
    other = whisper.copy_state(source)
    whisper.extend(source, [50364, 440, 441, 442])
    whisper.extend(other, [50364, 440, 600])
    reference = whisper.copy_state(source)
    whisper.copy_state_into(source, other)
    assert other.tokens == source.tokens
    assert torch.equal(whisper.extend(other, [443])[-1], whisper.extend(reference, [443])[-1])
    stale = whisper.prefill(request)
    whisper.extend(stale, [50364, 440, 600, 601])
    stale.tokens[:] = source.tokens  # the control: tokens without their rows
    assert not torch.equal(whisper.extend(stale, [443])[-1], whisper.extend(whisper.copy_state(source), [443])[-1])
