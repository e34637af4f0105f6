"""Batched long-form (transcription/batched.py, decoding/lockstep.py): chunks over different
encoder outputs decoded side by side in shared calls are bitwise each chunk decoded alone, greedy
and beam; the control makes every row of a call attend to its first row's encoder output, and the
same comparison fails. Chunking loses no sample; a chunk's cut last segment is kept."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from asyncspec.decoding.beam_search import decode_beam_batch, decode_beam_search
from asyncspec.decoding.result import DecodeConfig
from asyncspec.decoding.target_only import decode_target_batch, decode_target_only
from asyncspec.models import forward_whisper
from asyncspec.transcription.batched import CHUNK_SAMPLES, chunk_bounds
from asyncspec.transcription.segments import TimedPiece, unfinished_piece
from asyncspec.transcription.vad import SpeechMap
from conftest import synthetic_speech, tiny_whisper


def chunk_requests(whisper, count: int, tokens: int = 30):
    requests = []
    for seed in range(count):
        audio = synthetic_speech(1.5 + 0.25 * seed, seed=40 + seed)
        request = whisper.request(audio, max_new_tokens=tokens, timestamps=True)
        requests.append(replace(request, encoded=whisper.encode_audio(audio)))
    return requests


def same(a, b) -> bool:
    return all(
        x.tokens == y.tokens and x.stats.logprobs == y.stats.logprobs and x.stats.finish_reason == y.stats.finish_reason
        for x, y in zip(a, b, strict=True)
    )


@pytest.fixture
def one_cross(monkeypatch):
    """The control: every row of a call attends to the first row's encoder output."""
    monkeypatch.setattr(forward_whisper, "cross_groups", lambda slots, width: [(0, width)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_chunks_side_by_side_are_bitwise_each_chunk_alone(dtype):
    whisper = tiny_whisper(dtype, seed=31, peak=12.0)
    requests = chunk_requests(whisper, whisper.call_width + 3)  # two calls a step, one of them narrow
    alone = [decode_target_only(whisper, None, request) for request in requests]
    batched = decode_target_batch(whisper, requests)
    assert same(alone, batched)
    assert len({tuple(result.stats.logprobs) for result in alone}) > len(alone) // 2  # the chunks really differ


def test_chunks_that_all_attend_to_one_output_differ(one_cross):
    whisper = tiny_whisper(torch.float32, seed=31, peak=12.0)
    requests = chunk_requests(whisper, 4)
    alone = [decode_target_only(whisper, None, request) for request in requests]
    assert not same(alone, decode_target_batch(whisper, requests))


def test_beam_searches_side_by_side_are_each_search_alone():
    whisper = tiny_whisper(torch.float32, seed=32, peak=12.0)
    requests = chunk_requests(whisper, 3, tokens=20)
    config = DecodeConfig(beam_size=3)
    alone = [decode_beam_search(whisper, request, config) for request in requests]
    assert same(alone, decode_beam_batch(whisper, requests, config))


def test_a_chunk_wider_than_alone_is_refused_in_a_prompt_call():
    whisper = tiny_whisper(torch.float32, seed=33)
    first, second = (whisper.prefill(request) for request in chunk_requests(whisper, 2))
    slots = [forward_whisper.RowSlot(first.cache, first.length), forward_whisper.RowSlot(second.cache, second.length)]
    with pytest.raises(ValueError, match="several encoder outputs"):
        whisper.engine.forward(slots, torch.tensor([440, 441]), prompt=True)


def test_chunk_bounds_keep_every_sample_and_stay_within_30_s():
    second = 16_000
    regions = ((0, 10 * second), (12 * second, 31 * second), (40 * second, 45 * second), (50 * second, 120 * second))
    speech = SpeechMap(regions)
    bounds = chunk_bounds(speech)
    joined = [(0, 29), (29, 34), (34, 64), (64, 94), (94, 104)]  # 10 + 19 s fit one chunk; 70 s is cut
    assert bounds == [(start * second, end * second) for start, end in joined]
    assert all(0 < end - start <= CHUNK_SAMPLES for start, end in bounds)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # contiguous
    assert bounds[0][0] == 0 and bounds[-1][1] == speech.speech_samples  # nothing lost


def test_a_chunk_cut_inside_a_segment_keeps_it_to_the_chunk_end():
    whisper = tiny_whisper(torch.float32, seed=34)
    rules, begin = whisper.timestamp_rules, whisper.timestamp_rules.timestamp_begin
    tokens = [begin, 440, begin + 50, begin + 50, 441, 442]  # 0.00 text 1.00 | 1.00 text (cut)
    done = [TimedPiece(3.0, 4.0, tuple(tokens[:3]))]
    tail = unfinished_piece(rules, tokens, done, offset_s=3.0, end_s=9.5)
    assert tail == [TimedPiece(4.0, 9.5, tuple(tokens[3:]))]
    assert unfinished_piece(rules, tokens[:4], done, 3.0, 9.5) == []  # a lone timestamp holds no text


@pytest.mark.real
def test_batched_transcription_of_real_speech_equals_its_chunks_one_at_a_time():
    from asyncspec import Transcriber
    from asyncspec.audio import SAMPLE_RATE, load_audio
    from asyncspec.data.librivox import librivox_clips
    from asyncspec.text_metrics import word_recall

    clips = librivox_clips()
    pieces = [piece for clip in clips for piece in (load_audio(clip.path), np.zeros(SAMPLE_RATE, np.float32))]
    audio = np.concatenate(pieces * 2)
    reference = " ".join(clip.transcript for clip in clips * 2)
    with Transcriber("whisper-base", method="target") as transcriber:
        one, info_one = transcriber.transcribe(audio, batch_size=1)
        one = list(one)
        batched, info = transcriber.transcribe(audio, batch_size=4)
        batched = list(batched)
    assert info.stats.windows == info_one.stats.windows >= 2  # several chunks, the same ones
    assert [segment.as_dict() for segment in batched] == [segment.as_dict() for segment in one]
    assert all(b.start >= a.start for a, b in zip(batched, batched[1:], strict=False))  # original time, in order
    assert batched[-1].end <= len(audio) / SAMPLE_RATE
    assert word_recall(reference, " ".join(segment.text for segment in batched)) >= 0.9
