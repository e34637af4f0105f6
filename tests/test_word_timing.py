"""Word timing's parts against plain references: the vectorised DTW against openai-whisper's loop
(written out below), the median filter against numpy, word splitting on the real tokenizer, and
punctuation merging; the highlighted SRT/VTT cues parse and never go backwards."""

from __future__ import annotations

import io

import numpy as np
import pytest
import srt
import torch
import webvtt

from asyncspec.models.tokenizer import TextTokenizer
from asyncspec.transcription.outputs import to_srt, to_vtt
from asyncspec.transcription.segments import Segment
from asyncspec.transcription.word_timing import Word, dtw, median_filter, merge_punctuations, split_words
from conftest import real_model_dir


def reference_dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai-whisper's dtw_cpu and backtrace, cell by cell."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf)
    trace = -np.ones((n + 1, m + 1))
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, path = n, m, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        if trace[i, j] == 0:
            i, j = i - 1, j - 1
        elif trace[i, j] == 1:
            i -= 1
        else:
            j -= 1
    found = np.array(path[::-1])
    return found[:, 0], found[:, 1]


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorised_dtw_is_openai_whispers(seed):
    rng = np.random.default_rng(seed)
    rows, columns = rng.integers(1, 12), rng.integers(1, 60)
    x = rng.normal(size=(rows, columns))
    if seed % 2:
        x = np.round(x, 1)  # ties: the same preference (diagonal, down, right) must win
    ours, theirs = dtw(x), reference_dtw(x)
    assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])


def test_the_median_filter_is_a_reflected_sliding_median():
    x = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(1))
    padded = np.pad(x.numpy(), ((0, 0), (0, 0), (3, 3)), mode="reflect")
    expected = np.stack([np.median(padded[..., i : i + 7], axis=-1) for i in range(40)], axis=-1)
    assert np.allclose(median_filter(x, 7).numpy(), expected)


@pytest.fixture(scope="module")
def tokenizer():
    return TextTokenizer.from_file(real_model_dir("whisper-tiny.en") / "tokenizer.json")


def test_words_split_at_spaces_and_punctuation_then_merge(tokenizer):
    eot = tokenizer.token_id("<|endoftext|>")
    tokens = tokenizer.encode(' "Dashwood," she said, (quietly).')
    words, groups = split_words(tokenizer, tokens + [eot], eot, "en")
    assert "".join(words) == ' "Dashwood," she said, (quietly).' and words[-1] == "" and groups[-1] == [eot]
    assert sum(len(g) for g in groups) == len(tokens) + 1
    timings = [{"word": w, "tokens": g, "start": 0.0, "end": 0.0} for w, g in zip(words[:-1], groups[:-1], strict=True)]
    merge_punctuations(timings)
    kept = [t["word"] for t in timings if t["word"]]
    assert kept == [' "Dashwood,"', " she", " said,", " (quietly)."], kept
    assert sum(len(t["tokens"]) for t in timings) == len(tokens)  # emptied entries keep no tokens


def test_highlighted_cues_parse_and_never_go_backwards():
    words = [Word(1.0, 1.4, " One", 0.9), Word(1.6, 2.0, " two,", 0.8), Word(2.0, 2.5, " three.", 0.7)]
    segments = [
        Segment(1, 0, 1.0, 2.5, " One two, three.", (), -0.1, 1.0, 0.0, 0.0, words=words),
        Segment(2, 0, 2.4, 3.0, " Four.", (), -0.1, 1.0, 0.0, 0.0, words=[Word(2.4, 3.0, " Four.", 0.9)]),
    ]
    cues = list(srt.parse(to_srt(segments, {}, highlight=True)))
    assert [c.content for c in cues] == [
        "<u>One</u> two, three.",
        "One two, three.",  # the gap between two words
        "One <u>two,</u> three.",
        "One two, <u>three.</u>",
        "<u>Four.</u>",
    ]
    assert all(a.end <= b.start for a, b in zip(cues, cues[1:], strict=False))
    vtt = webvtt.from_buffer(io.StringIO(to_vtt(segments, {}, highlight=True))).captions
    assert len(vtt) == 5 and vtt[3].raw_text == "One two, <u>three.</u>" and vtt[3].text == "One two, three."
    plain = list(srt.parse(to_srt(segments, {})))
    assert [c.content for c in plain] == ["One two, three.", "Four."]


def test_a_window_cut_at_its_token_limit_reads_no_row_that_was_never_fed(tokenizer):
    """The last output token of a window that hit its limit was never fed, so its row holds
    nothing; the words are still timed, from rows that were computed."""
    from asyncspec.transcription.word_timing import window_words

    eot = tokenizer.token_id("<|endoftext|>")
    output = tokenizer.encode(" one two three four")
    segment = Segment(1, 0, 0.0, 4.0, " one two three four", tuple(output), -0.1, 1.0, 0.0, 0.0)
    generator = torch.Generator().manual_seed(3)

    def weights_of(k: int) -> torch.Tensor:
        assert 0 <= k < len(output), f"row {k} was never fed"
        return torch.softmax(torch.randn(4, 1500, generator=generator), dim=-1)

    timed, _ = window_words(tokenizer, eot, [segment], output, [-0.1] * len(output), weights_of, 400, 0.0, "en", 0.0)
    words = timed[0].words
    assert [w.word for w in words] == [" one", " two", " three", " four"]
    assert all(0.0 <= w.start <= w.end <= 4.0 for w in words)
