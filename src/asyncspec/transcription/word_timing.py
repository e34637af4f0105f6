"""Word timestamps, as openai-whisper and faster-whisper compute them, from the cross-attention the
target engine recorded while it decoded the window (models/attention_record.py): nothing is
decoded again.

For a window's text tokens y_k, the row that predicted y_k (its input: the token before) gives the
weights of the model's alignment heads over the window's encoder frames. Those rows, and the one
after the last text token, are normalised per head and frame across the rows, median-filtered
along time (width 7), averaged over the heads, and aligned to time by dynamic time warping; a word
starts where the path enters the row of its first token. Then faster-whisper's rules: words at
sentence and segment boundaries no longer than twice the median word, punctuation merged into
the neighbouring word, the segment's own timestamps preferred where its first or last word is
too long, and segments starting and ending with their words."""

from __future__ import annotations

import string
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from asyncspec.transcription.segments import Segment

TOKENS_PER_SECOND = 50  # encoder frames per second of audio
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
NO_SPACE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}  # words are split by character there


@dataclass(frozen=True)
class Word:
    start: float
    end: float
    word: str
    probability: float


def window_words(
    tokenizer,
    eot: int,
    segments: list[Segment],
    output: Sequence[int],
    logprobs: Sequence[float],
    weights_of,
    frames: int,
    offset_s: float,
    language: str,
    last_speech_s: float,
) -> tuple[list[Segment], float]:
    """The window's segments with their words (and start/end adjusted to them), and the end of the
    last speech. output: the window's output tokens; logprobs[k]: log-probability of output[k];
    weights_of(k): [heads, 1500] weights of the row that predicted output[k]; frames: the window's
    mel frames."""
    indices = _text_indices(segments, output, eot)
    flat = [k for per_segment in indices for k in per_segment]
    if not flat:
        return segments, last_speech_s
    # and the row after the last text token, which is fed unless that token ended the output
    # (a window cut at its token limit): then its own row stands in
    after = min(flat[-1] + 1, len(output) - 1)
    rows = torch.stack([weights_of(k) for k in flat] + [weights_of(after)])  # [n + 1, heads, 1500]
    matrix = _alignment_matrix(rows, frames)
    text_indices, time_indices = dtw(-matrix)
    tokens = [output[k] for k in flat]
    firsts, count = set(), 0  # a segment's first token starts a word, space or not
    for per_segment in indices:
        firsts.add(count)
        count += len(per_segment)
    words, word_tokens = split_words(tokenizer, tokens + [eot], eot, language, firsts)
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    probabilities = np.exp([logprobs[k] for k in flat])
    timings = [
        {"word": word, "tokens": wt, "start": float(jump_times[i]), "end": float(jump_times[j])}
        | {"probability": float(np.mean(probabilities[i:j]))}
        for word, wt, i, j in zip(words[:-1], word_tokens[:-1], boundaries[:-1], boundaries[1:], strict=True)
    ]
    median, longest = _clip_long_words(timings)
    merge_punctuations(timings)
    return _assign(segments, indices, timings, offset_s, median, longest, last_speech_s)


def _text_indices(segments: list[Segment], output: Sequence[int], eot: int) -> list[list[int]]:
    """Per segment, the output indices of its text tokens (segments are slices of the output, in order)."""
    found, cursor = [], 0
    for segment in segments:
        length = len(segment.tokens)
        while cursor + length <= len(output) and tuple(output[cursor : cursor + length]) != segment.tokens:
            cursor += 1
        found.append([cursor + i for i, token in enumerate(segment.tokens) if token < eot])
        cursor += length
    return found


def _alignment_matrix(rows: torch.Tensor, frames: int) -> np.ndarray:
    weights = rows[:, :, : max(frames // 2, 1)].float().permute(1, 0, 2)  # [heads, n + 1, window frames]
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=1e-30)  # the softmax over the window
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = median_filter((weights - mean) / std.clamp(min=1e-12), MEDIAN_FILTER_WIDTH)
    return weights.mean(dim=0).double().numpy()


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window along the last axis, edges reflected."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    flat = x.reshape(-1, x.shape[-1])  # reflection pads a 2-D [rows, frames] input
    padded = torch.nn.functional.pad(flat, (pad, pad), mode="reflect")
    return padded.unfold(-1, width, 1).median(dim=-1).values.reshape(x.shape)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai-whisper's DTW (steps: diagonal, down, right; that preference on ties), computed one
    anti-diagonal at a time. cost [N, M] -> (row, column) indices of the path from (0, 0) to (N-1, M-1)."""
    rows, columns = cost.shape
    total = np.full((rows + 1, columns + 1), np.inf)
    total[0, 0] = 0
    trace = np.full((rows + 1, columns + 1), -1, dtype=np.int8)
    for diagonal in range(2, rows + columns + 1):
        i = np.arange(max(1, diagonal - columns), min(rows, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        total[i, j] = cost[i - 1, j - 1] + np.choose(step, [c0, c1, c2])
        trace[i, j] = step
    trace[0, :], trace[:, 0] = 2, 1
    i, j, path = rows, columns, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
    found = np.array(path[::-1])
    return found[:, 0], found[:, 1]


def split_words(
    tokenizer, tokens: list[int], eot: int, language: str, firsts: Collection[int] = ()
) -> tuple[list[str], list[list[int]]]:
    """Words and their tokens: whole characters first, then (except in languages written without
    spaces) a new word at every leading space, punctuation mark or special token, and at every
    index in `firsts` (a segment's first token)."""
    pieces: list[str] = []
    piece_tokens: list[list[int]] = []
    piece_starts: list[int] = []  # index of each piece's first token
    current: list[int] = []
    for index, token in enumerate(tokens):
        if token >= eot:  # a special token (the closing end of text): a word of its own, without text
            if current:
                pieces.append(tokenizer.decode(current))
                piece_tokens.append(current)
                piece_starts.append(index - len(current))
                current = []
            pieces.append("")
            piece_tokens.append([token])
            piece_starts.append(index)
            continue
        current.append(token)
        text = tokenizer.decode(current)
        if "\ufffd" not in text:  # whole characters only (a multi-byte one may span tokens)
            pieces.append(text)
            piece_tokens.append(current)
            piece_starts.append(index + 1 - len(current))
            current = []
    if language in NO_SPACE_LANGUAGES:
        return pieces, piece_tokens
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for piece, group, first in zip(pieces, piece_tokens, piece_starts, strict=True):
        starts = group[0] >= eot or piece.startswith(" ") or piece.strip() in string.punctuation or not words
        starts = starts or first in firsts
        if starts:
            words.append(piece)
            word_tokens.append(list(group))
        else:
            words[-1] += piece
            word_tokens[-1].extend(group)
    return words, word_tokens


def _clip_long_words(timings: list[dict]) -> tuple[float, float]:
    durations = np.array([t["end"] - t["start"] for t in timings])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        for i in range(1, len(timings)):
            if timings[i]["end"] - timings[i]["start"] > longest:
                if timings[i]["word"] in SENTENCE_END_MARKS:
                    timings[i]["end"] = timings[i]["start"] + longest
                elif timings[i - 1]["word"] in SENTENCE_END_MARKS:
                    timings[i]["start"] = timings[i]["end"] - longest
    return median, longest


def merge_punctuations(timings: list[dict]) -> None:
    """Leading punctuation into the word after it, trailing punctuation into the word before it,
    across entries already emptied (which stay, with no text and no tokens)."""
    target, i = len(timings) - 1, len(timings) - 2
    while i >= 0:
        previous, following = timings[i], timings[target]
        if previous["word"].startswith(" ") and previous["word"].strip() in PREPEND_PUNCTUATIONS:
            following["word"], following["tokens"] = (
                previous["word"] + following["word"],
                previous["tokens"] + following["tokens"],
            )
            previous["word"], previous["tokens"] = "", []
        else:
            target = i
        i -= 1
    target, j = 0, 1
    while j < len(timings):
        previous, following = timings[target], timings[j]
        if not previous["word"].endswith(" ") and following["word"] in APPEND_PUNCTUATIONS:
            previous["word"], previous["tokens"] = (
                previous["word"] + following["word"],
                previous["tokens"] + following["tokens"],
            )
            following["word"], following["tokens"] = "", []
        else:
            target = j
        j += 1


def _assign(
    segments: list[Segment],
    indices: list[list[int]],
    timings: list[dict],
    offset_s: float,
    median: float,
    longest: float,
    last_speech_s: float,
) -> tuple[list[Segment], float]:
    out, position = [], 0
    for segment, text_indices in zip(segments, indices, strict=True):
        words, saved = [], 0
        while position < len(timings) and saved < len(text_indices):
            timing = timings[position]
            if timing["word"]:
                start, end = round(offset_s + timing["start"], 2), round(offset_s + timing["end"], 2)
                words.append({"word": timing["word"], "start": start, "end": end, "probability": timing["probability"]})
            saved += len(timing["tokens"])
            position += 1
        start, end = segment.start, segment.end
        if words:
            start, end = _fit_segment(words, start, end, median, longest, last_speech_s)
            last_speech_s = end
        out.append(replace(segment, start=start, end=end, words=[Word(**w) for w in words]))
    return out, last_speech_s


def _fit_segment(words: list[dict], start: float, end: float, median: float, longest: float, last_speech_s: float):
    """faster-whisper's boundary rules: the first words after a pause no longer than twice the
    median word; the segment's own timestamp where its first or last word is too long; else the
    segment starts and ends with its words."""
    first = words[0]
    long_first = first["end"] - first["start"] > longest
    long_pair = len(words) > 1 and words[1]["end"] - first["start"] > longest * 2
    if first["end"] - last_speech_s > median * 4 and (long_first or long_pair):
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > longest:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - longest)
            first["end"] = words[1]["start"] = boundary
        first["start"] = max(0, first["end"] - longest)
    if start < first["end"] and start - 0.5 > first["start"]:
        first["start"] = max(0, min(first["end"] - median, start))
    else:
        start = first["start"]
    last = words[-1]
    if end > last["start"] and end + 0.5 < last["end"]:
        last["end"] = max(last["start"] + median, end)
    else:
        end = last["end"]
    return start, end
