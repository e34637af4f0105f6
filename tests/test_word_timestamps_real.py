"""Word timestamps on Whisper base: taken from the engine's own cross-attention while it decodes
(nothing decoded again), equal between As²d and target-only, the same text as without them, and
within 0.1 s of faster-whisper's word times (an independent implementation: CTranslate2 aligns
in a pass of its own). An engine that records the wrong rows fails that comparison."""

from __future__ import annotations

import difflib

import numpy as np
import pytest

from asyncspec.audio import SAMPLE_RATE, load_audio
from asyncspec.data.librivox import librivox_clips

pytestmark = pytest.mark.real
CLOSE_S = 0.1  # a word's start and end within this of faster-whisper's ...
CLOSE_SHARE = 0.9  # ... for at least this share of the words both transcripts hold


@pytest.fixture(scope="module")
def recording() -> np.ndarray:
    clips = [load_audio(clip.path) for clip in librivox_clips()[:3]]
    pause = np.zeros(SAMPLE_RATE, dtype=np.float32)
    return np.concatenate([clips[0], pause, clips[1], pause, clips[2]])


@pytest.fixture(scope="module")
def transcriber():
    from asyncspec import Transcriber

    with Transcriber("whisper-base", ("as2d", "target")) as t:
        yield t


@pytest.fixture(scope="module")
def faster_whisper_words(recording):
    faster_whisper = pytest.importorskip("faster_whisper")
    from asyncspec.benchmarks.e2e_systems import ct2_directory

    model = faster_whisper.WhisperModel(str(ct2_directory("whisper-base")), compute_type="int8", cpu_threads=1)
    segments, _ = model.transcribe(recording, language="en", beam_size=1, word_timestamps=True)
    return [(w.word, w.start, w.end) for s in segments for w in s.words]


def words_of(transcriber, audio, method: str, **options):
    segments, _ = transcriber.transcribe(audio, method=method, word_timestamps=True, **options)
    segments = list(segments)
    return segments, [(w.word, w.start, w.end) for s in segments for w in s.words]


def close_share(ours: list, theirs: list) -> tuple[float, int]:
    """(the share of the words both hold, matched in order, whose start and end are within
    CLOSE_S of faster-whisper's; how many were matched)."""
    matcher = difflib.SequenceMatcher(a=[w[0] for w in ours], b=[w[0] for w in theirs], autojunk=False)
    pairs = [(ours[b.a + k], theirs[b.b + k]) for b in matcher.get_matching_blocks() for k in range(b.size)]
    close = sum(abs(a[1] - b[1]) <= CLOSE_S and abs(a[2] - b[2]) <= CLOSE_S for a, b in pairs)
    return close / max(len(pairs), 1), len(pairs)


def test_word_times_match_faster_whisper_and_as2d_equals_target_only(transcriber, recording, faster_whisper_words):
    target_segments, target_words = words_of(transcriber, recording, "target")
    as2d_segments, as2d_words = words_of(transcriber, recording, "as2d")
    assert as2d_words == target_words and as2d_segments == target_segments  # bit for bit: the same rows
    plain = list(transcriber.transcribe(recording, method="target")[0])
    assert [s.tokens for s in plain] == [s.tokens for s in target_segments]  # timing words changes no text
    for segment in target_segments:
        assert "".join(w.word for w in segment.words) == segment.text
        assert all(w.start <= w.end for w in segment.words) and all(0 < w.probability <= 1 for w in segment.words)
    starts = [w[1] for w in target_words]
    assert starts == sorted(starts) and len(target_words) >= 40
    share, matched = close_share(target_words, faster_whisper_words)
    assert matched >= 0.9 * len(faster_whisper_words) and share >= CLOSE_SHARE, (share, matched)


def test_rows_recorded_from_the_wrong_place_fail_the_comparison(
    transcriber, recording, faster_whisper_words, monkeypatch
):
    """The control: an engine that records, for every row of a call, the weights of the call's
    first row (as a recorder blind to the row would)."""
    from asyncspec.models import forward_whisper
    from asyncspec.models.attention_record import record_cross_attention

    def first_row_only(slots, layer, weights):
        record_cross_attention(slots, layer, weights[:, :1].expand_as(weights))

    monkeypatch.setattr(forward_whisper, "record_cross_attention", first_row_only)
    _, wrong = words_of(transcriber, recording, "as2d")
    share, _ = close_share(wrong, faster_whisper_words)
    assert share < CLOSE_SHARE, share


def test_word_starts_against_festivals_own_word_times(transcriber, tmp_path):
    """Festival reports where it put each word, so the synthesised speech has a timing to trust:
    the median word-start error is under 0.2 s, and within one timestamp step (20 ms) of
    faster-whisper's on the same files (measured on 12 files: 0.052 s against 0.048 s)."""
    faster_whisper = pytest.importorskip("faster_whisper")
    from asyncspec.benchmarks.e2e_systems import ct2_directory
    from asyncspec.benchmarks.word_timing import start_errors
    from asyncspec.data.timed_words import timed_set

    files = timed_set(tmp_path, passages=2)
    model = faster_whisper.WhisperModel(str(ct2_directory("whisper-base")), compute_type="int8", cpu_threads=1)
    ours, theirs = [], []
    for path, _, truth in files:
        segments, _ = transcriber.transcribe(path, method="as2d", language="en", word_timestamps=True)
        ours += start_errors([(w.word, w.start, w.end) for s in segments for w in s.words], truth)
        segments, _ = model.transcribe(str(path), language="en", beam_size=1, word_timestamps=True)
        theirs += start_errors([(w.word, w.start, w.end) for s in segments for w in s.words], truth)
    reference_words = sum(len(truth) for _, _, truth in files)
    assert len(ours) >= 0.8 * reference_words and len(theirs) >= 0.8 * reference_words
    assert np.median(ours) <= 0.2 and np.median(ours) <= np.median(theirs) + 0.02, (np.median(ours), np.median(theirs))
