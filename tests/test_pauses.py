"""Long pauses are found by energy, and a transcription without VAD that has them says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.transcription.api import Transcriber
from asyncspec.transcription.pauses import LONG_PAUSE_S, long_pauses, pause_note
from conftest import tiny_whisper

ROOM_TONE = 3e-4  # about -70 dBFS, as the long-form set's pauses


def with_pauses(speech: np.ndarray, pauses_s: list[float], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pieces = [speech]
    for pause in pauses_s:
        pieces += [rng.normal(0, ROOM_TONE, round(pause * 16_000)).astype(np.float32), speech]
    return np.concatenate(pieces)


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return load_audio(librivox_clips()[0].path)[: 4 * 16_000]  # real read speech, with its own short gaps


def test_pauses_of_five_seconds_or_more_are_found_where_they_are(speech):
    audio = with_pauses(speech, [2.0, 7.0, 3.0, 12.0])
    found = long_pauses(audio)
    assert len(found) == 2, found
    starts = [4 + 2 + 4, 4 + 2 + 4 + 7 + 4 + 3 + 4]  # where the 7 s and 12 s pauses begin
    for (start, end), expected_start, length in zip(found, starts, (7.0, 12.0), strict=True):
        assert abs(start - expected_start) < 0.6 and abs((end - start) - length) < 1.2, found
    assert long_pauses(with_pauses(speech, [2.0, 3.0, 4.0])) == []  # pauses of speech, not silences
    assert long_pauses(np.zeros(0, dtype=np.float32)) == [] and long_pauses(np.zeros(16_000, np.float32)) == []


def test_the_note_names_the_longest_pause_and_vad(speech):
    note = pause_note(with_pauses(speech, [6.0, 9.0]))
    assert note is not None and "2 pause(s)" in note and "the longest 9.0 s" in note and "--vad" in note
    assert pause_note(with_pauses(speech, [1.0, 2.0])) is None
    assert LONG_PAUSE_S == 5.0


def test_a_transcription_with_a_long_pause_and_no_vad_says_so():
    target = tiny_whisper(torch.float32, seed=31)
    transcriber = Transcriber.from_loaded(target, {}, "tiny")
    speech = load_audio(librivox_clips()[0].path)[: 3 * 16_000]
    quick = {"temperatures": (0.0,), "language": "en"}
    _, gapped = transcriber.transcribe(with_pauses(speech, [8.0]), **quick)
    assert any("pause(s)" in note for note in gapped.notes), gapped.notes
    _, continuous = transcriber.transcribe(with_pauses(speech, [0.5]), **quick)
    assert not any("pause(s)" in note for note in continuous.notes), continuous.notes
