"""Whisper's long-form algorithm over a whole recording, on any decode method.

A window is the 30 s of audio from the seek. It is decoded with timestamps, conditioned on the
previous windows' text (`<|startofprev|>`), and checked as faster-whisper checks it (its default
thresholds): a window that is too repetitive (gzip compression ratio) or too unlikely (average
log-probability) is decoded again at the next temperature, sampled by output position and seeded
per window, best of `best_of`; a window the model finds silent (no-speech probability over the
threshold and unlikely text) is skipped and counted. Its complete segments are kept and the next
window starts at the last complete timestamp, so a window boundary never cuts speech.

One rule differs from openai-whisper's and faster-whisper's: where a window's output is complete
(it ends on a lone timestamp, or has no timestamp pair) they move on by the whole window, on the
model's word that the rest is silent. Greedy Whisper base often stops early there (measured on the
long-form set: "signifying nothing.<|2.00|>" then end-of-text, with 27 s of speech after it), and
that speech is lost without a trace. So the next window starts at the end of the last segment
instead, when that is more than EARLY_END_S before the window's end and at least MIN_PROGRESS_S
after its start (`resume_after_early_end`, on by default; off gives the reference rule). Silence
costs one more window; speech is never skipped.

The decode method only ever sees a `DecodeRequest` and a `DecodeConfig`, so target-only and every
speculative method run this loop identically; greedy windows and positional samples are the same
tokens under every method, and so are the seeks, prompts and segments that follow from them.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from asyncspec.audio import SAMPLE_RATE
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.models.attention_record import AttentionSink
from asyncspec.models.base import DecodeRequest
from asyncspec.transcription.segments import (
    FRAMES_PER_SECOND,
    Segment,
    split_by_timestamps,
    text_of,
    unfinished_piece,
)

SAMPLES_PER_FRAME = SAMPLE_RATE // FRAMES_PER_SECOND
WINDOW_FRAMES = 30 * FRAMES_PER_SECOND
EARLY_END_S = 1.0  # a complete window whose last segment ends this much before its end resumes there
MIN_PROGRESS_S = 1.0  # ... if that is this far past its start (no crawl through a noisy stretch)
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)

# (request, configs, seek_s, end_s, earlier) -> the method's result for that window under each config: one
# greedy config, or a temperature's best-of draws (which the decoder may run side by side); the
# last argument: the tokens of the window's earlier draws, greedy first (what a draw may retrace)
WindowDecoder = Callable[[DecodeRequest, list[DecodeConfig], float, float, list[list[int]]], list[DecodeResult]]


@dataclass(frozen=True)
class LongformOptions:
    """faster-whisper's defaults, but greedy at temperature 0 (faster-whisper: beam_size 5)."""

    language: str = "en"  # the Transcriber detects it where None (a multilingual model's first window)
    task: str = "transcribe"  # or "translate" (to English)
    initial_prompt: str | None = None  # text that conditions the first window, as faster-whisper's
    hotwords: str | None = None  # words (names, terms) that condition every window, as faster-whisper's
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    best_of: int = 5
    # temperature 0 as a beam search (decoding/beam_search.py, CTranslate2's rule): faster-whisper
    # defaults to 5; 1 is greedy, the decoding As²d speculates on
    beam_size: int = 1
    patience: float = 1.0
    length_penalty: float = 1.0
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    prompt_reset_on_temperature: float = 0.5
    seed: int = 0
    resume_after_early_end: bool = True  # see the module docstring; False: Whisper's reference seek
    vad_filter: bool = False  # the Transcriber keeps only the speech Silero VAD finds (transcription/vad.py)
    # batched long-form (transcription/batched.py): the speech cut at pauses into chunks of up to
    # 30 s, decoded this many side by side, each on its own; None: window after window as above
    batch_size: int | None = None
    word_timestamps: bool = False  # every segment's words timed (transcription/word_timing.py)


@dataclass
class Attempt:
    """One decode of a window at one temperature."""

    request: DecodeRequest
    result: DecodeResult
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    # word timestamps: the attention_record.AttentionRecord of the state that decoded it (freed
    # once the window's words are timed)
    attention: Any = None


@dataclass
class WindowOutcome:
    index: int
    seek: int  # mel frame the window starts at
    frames: int  # its length in frames
    chosen: Attempt
    attempts: list[Attempt]  # per temperature tried, greedy first: its likeliest draw
    skipped: bool  # judged silent: nothing kept
    draws: list[Attempt] = field(default_factory=list)  # every decode run, the samples not kept included
    encode_s: float = 0.0  # the window's one encoder pass, shared by all its draws
    segments: list[Segment] = field(default_factory=list)
    next_seek: int = 0
    resumed_early: bool = False  # the next window starts at this one's last segment, not its end

    @property
    def fell_back(self) -> bool:
        return self.chosen.temperature > 0

    @property
    def start_s(self) -> float:
        return self.seek / FRAMES_PER_SECOND

    @property
    def next_start_s(self) -> float:
        return self.next_seek / FRAMES_PER_SECOND

    @property
    def end_s(self) -> float:
        return (self.seek + self.frames) / FRAMES_PER_SECOND


def transcribe_windows(
    target, decode_window: WindowDecoder, samples: np.ndarray, options: LongformOptions, encode=None
) -> Iterator[WindowOutcome]:
    """Every window of the recording in order, until the seek passes its end. `encode`: audio ->
    encoder output (default: the target's `encode_audio`)."""
    encode = encode or target.encode_audio
    content_frames = len(samples) // SAMPLES_PER_FRAME
    seek, index, reset_since, segment_id, last_speech_s = 0, 0, 0, 0, 0.0
    history = prompt_tokens(target, options.initial_prompt)
    hotwords = prompt_tokens(target, options.hotwords)
    while seek < content_frames:
        audio, frames = window_audio(samples, seek)
        previous = history[reset_since:]  # without conditioning: the initial prompt, first window only
        request, encode_s = _encoded_request(target, encode, audio, previous, hotwords, options)
        span_s = (seek / FRAMES_PER_SECOND, seek / FRAMES_PER_SECOND + len(audio) / SAMPLE_RATE)
        attempts, draws = _decode_with_fallback(target, decode_window, request, span_s, index, options)
        chosen = _choose(attempts, options)
        outcome = WindowOutcome(index, seek, frames, chosen, attempts, _is_silent(chosen, options), draws, encode_s)
        if outcome.skipped:
            outcome.next_seek = seek + frames
        else:
            outcome.segments, outcome.next_seek = _segments(target, outcome, segment_id)
            if options.resume_after_early_end and seek + frames < content_frames:
                _resume_after_early_end(outcome)
            if options.word_timestamps:  # after the seek is set: timing words changes no text
                outcome.segments, last_speech_s = _timed_words(target, outcome, options, last_speech_s)
            segment_id += len(outcome.segments)
            history += [t for segment in outcome.segments for t in segment.tokens]
        if not options.condition_on_previous_text or chosen.temperature > options.prompt_reset_on_temperature:
            reset_since = len(history)
        for attempt in outcome.attempts:
            attempt.attention = None  # ~25 MB each: kept only until the window's words are timed
        yield outcome
        seek, index = max(outcome.next_seek, seek + 1), index + 1  # always forward, however the window ended


def window_audio(samples: np.ndarray, seek: int) -> tuple[np.ndarray, int]:
    """(the samples of the window at mel frame `seek`, its length in frames): 30 s, or to the end."""
    content_frames = len(samples) // SAMPLES_PER_FRAME
    frames = min(WINDOW_FRAMES, content_frames - seek)
    end = len(samples) if seek + frames >= content_frames else (seek + frames) * SAMPLES_PER_FRAME
    return samples[seek * SAMPLES_PER_FRAME : end], frames


def prompt_tokens(target, text: str | None) -> list[int]:
    """An initial prompt's or the hotwords' tokens, as faster-whisper encodes them (a leading
    space, the text stripped)."""
    if not text or not text.strip():
        return []
    return list(target.tokenizer.encode(" " + text.strip()))


def _encoded_request(
    target, encode, audio: np.ndarray, previous: list[int], hotwords: list[int], options
) -> tuple[DecodeRequest, float]:
    """The window's request, carrying its encoder output: every draw of a fallback reuses it."""
    if options.language is None:
        raise ValueError("the language must be known (detected) before the first window")
    request = target.request(
        audio, language=options.language, timestamps=True, previous=previous, task=options.task, hotwords=hotwords
    )
    started = time.perf_counter()
    encoded = encode(audio)
    return replace(request, encoded=encoded), time.perf_counter() - started


def level_configs(options: LongformOptions, index: int, level: int) -> list[DecodeConfig]:
    """The decodes of window `index` at temperature level `level`: one at 0, best_of draws above."""
    temperature = options.temperatures[level]
    samples = 1 if temperature <= 0 else max(options.best_of, 1)
    return [
        DecodeConfig(
            temperature,
            _seed(options.seed, index, level, draw),
            positional_sampling=temperature > 0,
            beam_size=options.beam_size if temperature <= 0 else 1,  # as faster-whisper: beams at 0 only
            patience=options.patience,
            length_penalty=options.length_penalty,
        )
        for draw in range(samples)
    ]


def recording_request(target, request: DecodeRequest, options: LongformOptions) -> DecodeRequest:
    """The request as one level decodes it: with word timestamps, recording into a sink of its own."""
    return replace(request, attention=AttentionSink(target.backend)) if options.word_timestamps else request


def _decode_with_fallback(
    target, decode_window, request: DecodeRequest, span_s: tuple[float, float], index: int, options, first=None
) -> tuple[list[Attempt], list[Attempt]]:
    """(the likeliest draw per temperature tried, every draw) of the window spanning span_s.
    `first`: (the recording request, its results) of the first level, decoded already (beside
    other windows, transcription/batched.py)."""
    seek_s, end_s = span_s
    attempts: list[Attempt] = []
    draws: list[Attempt] = []
    for level, temperature in enumerate(options.temperatures):
        configs = level_configs(options, index, level)
        if level == 0 and first is not None:
            asked, results = first
        else:
            asked = recording_request(target, request, options)
            results = decode_window(asked, configs, seek_s, end_s, [draw.result.tokens for draw in draws])
        sink = asked.attention
        if len(results) != len(configs):
            raise RuntimeError(f"the window decoder returned {len(results)} results for {len(configs)} draws")
        tried = [_attempt(target, request, result, temperature) for result in results]
        draws += tried
        attempts.append(max(tried, key=lambda attempt: attempt.avg_logprob))
        if sink is not None:
            attempts[-1].attention = _recorded(sink, request, attempts[-1].result.tokens)
        if not _needs_fallback(attempts[-1], options):
            break
    return attempts, draws


def _recorded(sink, request: DecodeRequest, tokens):
    state = sink.state_for([*request.prompt_ids, *tokens[:-1]])  # the last token (end of text) is never fed
    # each state refers to the sink (for its copies): emptied, the draws not chosen and their
    # caches are freed now rather than at the next cyclic collection
    sink.states.clear()
    if state is None:
        raise RuntimeError("word timestamps: no recorded decoder state holds the chosen tokens")
    return state.cache.attention


def _timed_words(target, outcome: WindowOutcome, options: LongformOptions, last_speech_s: float):
    from asyncspec.transcription.word_timing import window_words

    chosen, tokenizer = outcome.chosen, target.tokenizer
    before = len(chosen.request.prompt_ids) - 1  # the row that predicted output[k] sits at before + k
    output, logprobs = chosen.result.tokens, chosen.result.stats.logprobs
    weights_of = lambda k: chosen.attention.weights[before + k]  # noqa: E731
    eot = tokenizer.token_id("<|endoftext|>")
    frames, offset_s = outcome.frames, outcome.start_s
    return window_words(
        tokenizer,
        eot,
        outcome.segments,
        output,
        logprobs,
        weights_of,
        frames,
        offset_s,
        options.language,
        last_speech_s,
    )


def _seed(seed: int, window: int, level: int, draw: int) -> int:
    return ((seed * 100_003 + window) * 31 + level) * 17 + draw


def _attempt(target, request: DecodeRequest, result: DecodeResult, temperature: float) -> Attempt:
    tokens = result.tokens
    text = text_of(target.tokenizer, target.timestamp_rules, tokens).strip()
    return Attempt(
        request=request,
        result=result,
        temperature=temperature,
        avg_logprob=sum(result.stats.logprobs) / (len(tokens) + 1),
        compression_ratio=compression_ratio(text),
        no_speech_prob=float(result.stats.prefill_figures.get("no_speech_prob", 0.0)),
    )


def compression_ratio(text: str) -> float:
    """gzip's ratio on the text: repetitive (looping) output compresses far better than speech."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _needs_fallback(attempt: Attempt, options: LongformOptions) -> bool:
    too_repetitive = (
        options.compression_ratio_threshold is not None
        and attempt.compression_ratio > options.compression_ratio_threshold
    )
    unlikely = options.log_prob_threshold is not None and attempt.avg_logprob < options.log_prob_threshold
    silent = (
        options.no_speech_threshold is not None and attempt.no_speech_prob > options.no_speech_threshold and unlikely
    )
    return (too_repetitive or unlikely) and not silent


def _choose(attempts: list[Attempt], options: LongformOptions) -> Attempt:
    """The last attempt if it passed; when every temperature failed, the likeliest attempt that is
    not too repetitive (else the likeliest), carrying the last temperature (the prompt reset reads it)."""
    if not _needs_fallback(attempts[-1], options):
        return attempts[-1]
    threshold = options.compression_ratio_threshold
    plausible = [a for a in attempts if threshold is None or a.compression_ratio <= threshold] or attempts
    best = max(plausible, key=lambda attempt: attempt.avg_logprob)
    return replace(best, temperature=attempts[-1].temperature)


def _resume_after_early_end(outcome: WindowOutcome) -> None:
    """A complete window that ended early: the next one starts at its last segment's end."""
    window_end = outcome.seek + outcome.frames
    if outcome.next_seek != window_end or not outcome.segments:
        return  # an unfinished window already resumes at its last complete timestamp
    last_end = round(outcome.segments[-1].end * FRAMES_PER_SECOND)
    early = window_end - last_end >= EARLY_END_S * FRAMES_PER_SECOND
    if early and last_end - outcome.seek >= MIN_PROGRESS_S * FRAMES_PER_SECOND:
        outcome.next_seek, outcome.resumed_early = last_end, True


def _is_silent(attempt: Attempt, options: LongformOptions) -> bool:
    if options.no_speech_threshold is None or attempt.no_speech_prob <= options.no_speech_threshold:
        return False
    return options.log_prob_threshold is None or attempt.avg_logprob <= options.log_prob_threshold


def _segments(target, outcome: WindowOutcome, first_id: int, keep_tail: bool = False) -> tuple[list[Segment], int]:
    """The window's segments and next seek. `keep_tail`: a last segment the window's end cut is
    kept, ending there (a batched chunk is decoded once: nothing decodes that speech again)."""
    rules, chosen = target.timestamp_rules, outcome.chosen
    pieces, next_seek = split_by_timestamps(rules, chosen.result.tokens, outcome.start_s, outcome.seek, outcome.frames)
    if keep_tail:
        pieces.extend(unfinished_piece(rules, chosen.result.tokens, pieces, outcome.start_s, outcome.end_s))
    segments: list[Segment] = []
    for piece in pieces:
        text = text_of(target.tokenizer, rules, piece.tokens)
        if piece.start == piece.end or not text.strip():
            continue  # as faster-whisper: neither output nor conditioning
        segments.append(
            Segment(
                id=first_id + len(segments) + 1,
                seek=outcome.seek,
                start=round(piece.start, 3),
                end=round(piece.end, 3),
                text=text,
                tokens=piece.tokens,
                avg_logprob=chosen.avg_logprob,
                compression_ratio=chosen.compression_ratio,
                no_speech_prob=chosen.no_speech_prob,
                temperature=chosen.temperature,
                window=outcome.index,
            )
        )
    return segments, next_seek
