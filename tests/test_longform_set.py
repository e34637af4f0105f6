"""The long-form evaluation set: built once per session from the Festival and espeak-ng voices and
pocketsphinx-testdata (about 15 s of synthesis), then checked for what it exists to test: length,
several voices, speaker changes, a dialogue, and pauses long and short."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile

from asyncspec.audio import SAMPLE_RATE
from asyncspec.data.longform_set import (
    LARGE_RECORDINGS,
    build_longform_set,
    file_transcript,
    longest_silence_s,
    longform_files,
    silence_share,
)
from asyncspec.data.longform_texts import RECORDINGS


@pytest.fixture(scope="session")
def longform(tmp_path_factory):
    """The large set: the three recordings `bench e2e` runs by default and five more."""
    directory = tmp_path_factory.mktemp("longform")
    return directory, longform_files(directory, LARGE_RECORDINGS)


def manifest(wav) -> dict:
    return json.loads(wav.with_suffix(".json").read_text())


def test_silence_measures_find_pauses_and_only_pauses():
    tone = 0.5 * np.sin(2 * np.pi * 220 * np.arange(SAMPLE_RATE) / SAMPLE_RATE).astype(np.float32)
    gap = np.zeros(3 * SAMPLE_RATE, dtype=np.float32)
    audio = np.concatenate([tone, gap, tone, gap[: SAMPLE_RATE // 2], tone])
    assert silence_share(tone) == 0.0
    assert silence_share(audio) == pytest.approx(3.5 / 6.5, abs=0.01)
    assert longest_silence_s(audio) == pytest.approx(3.0, abs=0.02)


def test_the_real_recordings_take_their_own_transcriptions():
    assert file_transcript("cards/001.wav") == "ten of clubs"
    assert (
        file_transcript("librivox/sense_and_sensibility_01_austen_64kb-0880.wav")
        == "he was not an ill disposed young man"
    )
    assert file_transcript("goforward.raw") == "go forward ten meters"


@pytest.mark.real
def test_the_sets_have_three_and_eight_long_recordings_with_their_references(longform):
    _, files = longform
    assert [wav.stem for wav, _ in files][:3] == list(RECORDINGS) and len(files) == len(LARGE_RECORDINGS) == 8
    durations = [soundfile.info(str(wav)).duration for wav, _ in files]
    assert all(duration >= 120 for duration in durations), durations
    assert sum(durations[:3]) <= 9 * 60 and sum(durations) <= 20 * 60
    assert sum(len(reference.split()) for _, reference in files) >= 2.5 * sum(
        len(reference.split()) for _, reference in files[:3]
    )
    for wav, reference in files:
        info = soundfile.info(str(wav))
        assert (info.samplerate, info.channels) == (SAMPLE_RATE, 1)
        pieces = manifest(wav)["pieces"]
        # The reference is exactly what the pieces say, in order, and every piece says something.
        assert reference == "\n".join(piece["text"] for piece in pieces) + "\n"
        assert all(piece["text"].strip() for piece in pieces) and len(reference.split()) > 250
        assert all(a["end_s"] <= b["start_s"] for a, b in zip(pieces, pieces[1:], strict=False))
        assert pieces[-1]["end_s"] <= info.duration + 1e-3


@pytest.mark.real
def test_every_recording_has_several_voices_and_speaker_changes(longform):
    for wav, _ in longform[1]:
        voices = [piece["voice"] for piece in manifest(wav)["pieces"]]
        changes = sum(a != b for a, b in zip(voices, voices[1:], strict=False))
        assert len(set(voices)) >= 4 and changes >= 6, (wav.stem, voices)


@pytest.mark.real
def test_the_dialogue_alternates_two_voices_line_by_line(longform):
    voices = [piece["voice"] for piece in manifest(longform[0] / "dialogue.wav")["pieces"]]
    longest = run = 1
    for before, voice, after in zip(voices, voices[1:], voices[2:], strict=False):
        run = run + 1 if voice != before and after == before else 1
        longest = max(longest, run)
    assert longest >= 10  # at least ten lines of A, B, A, B ...


@pytest.mark.real
def test_the_recordings_pause_briefly_and_at_length(longform):
    for wav, _ in longform[1]:
        audio, _ = soundfile.read(str(wav), dtype="float32")
        pauses = [piece["pause_after_s"] for piece in manifest(wav)["pieces"]]
        assert min(pauses) <= 0.5 and max(pauses) >= 3.0
        # Measured in the audio, not just scripted: a long silence, and quiet a good share of the time.
        assert longest_silence_s(audio) >= 3.0
        assert 0.1 <= silence_share(audio) <= 0.5


@pytest.mark.real
def test_a_current_set_is_reused_not_rebuilt(longform):
    directory, files = longform
    before = {wav: wav.stat().st_mtime_ns for wav, _ in files}
    assert build_longform_set(directory) == [wav for wav, _ in files][:3]
    assert build_longform_set(directory, LARGE_RECORDINGS) == [wav for wav, _ in files]
    assert {wav: wav.stat().st_mtime_ns for wav, _ in files} == before
