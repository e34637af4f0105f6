"""The library API: `Transcriber(model).transcribe(audio) -> (segments, info)`, the one path from a
recording to timed text that the command line, `bench e2e` and the services use.

    from asyncspec import Transcriber
    with Transcriber("whisper-base") as t:
        segments, info = t.transcribe("talk.mp3")

Segments are produced lazily, window by window, as faster-whisper's are; `info.stats` fills in
as they are consumed. The default method, auto, is As²d where the machine has a core to spare for
its producer (transcription/method_choice.py): a producer process transcribes the recording with
tiny.en from its audio alone, and the target verifies what it published. Every greedy window
equals target-only's (`method="target"`), token for token, timestamps included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from asyncspec.audio import SAMPLE_RATE, load_audio, validate_samples
from asyncspec.errors import InputError
from asyncspec.models.threads import torch_threads
from asyncspec.transcription.decode_threads import beside_threads, decode_threads
from asyncspec.transcription.longform import LongformOptions, WindowOutcome, transcribe_windows, window_audio
from asyncspec.transcription.method_choice import AUTO, resolve_auto, runnable
from asyncspec.transcription.segments import Segment
from asyncspec.transcription.vad import in_original_time

METHODS = ("as2d", "target", "sd", "specasr")
POSITIONAL_SAMPLERS = {"as2d", "target"}  # methods that decode a lone fallback draw themselves
PREFIX_DRAFTED = {"sd", "specasr"}
# Where the speculative methods' fallback draws may stack their rows into wider calls (the batch
# check of the self-test runs once per machine up to this many blocks); target-only's never do.
DRAW_STACK_BLOCKS = 8


@dataclass
class TranscriptionStats:
    """What the transcription did, filled in while its segments are consumed."""

    windows: int = 0
    fallbacks: int = 0  # windows decoded again at a higher temperature (and kept so)
    skipped: list[float] = field(default_factory=list)  # start (s) of windows judged silent
    resumed_early: int = 0  # windows whose text ended early, followed from their last segment
    tokens: int = 0
    decodes: int = 0  # decode calls, fallback attempts included
    solo_decodes: int = 0  # of those, decoded on `solo_threads` (nothing drafting beside the target)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    producer_failure: str | None = None


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float
    method: str
    model: str
    options: LongformOptions
    stats: TranscriptionStats = field(default_factory=TranscriptionStats)
    windows: list[WindowOutcome] = field(default_factory=list)  # for exactness checks and reports
    # As²d: what the producer published for the recording, (offset, tokens, start_s, end_s) per
    # batch; a function of the audio alone (the decoupling test compares it across targets)
    publications: list[tuple] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the user should know (a method that could not run)
    duration_after_vad: float | None = None  # with vad_filter: the speech transcribed, in seconds


class Transcriber:
    """Whisper long-form transcription on the fixed-shape target engine.

    method: "auto" (default: As²d where the machine leaves its producer a core of its own, else
    target-only; method_choice.py, the choice in `method_note`), "as2d", "target", "sd" or
    "specasr", or several (the first is the default of `transcribe`; target-only is always
    available). dtype: the target decoder's ("auto": int8,
    bf16 or fp32, the fastest on this machine; "int8", "bf16" or "fp32"); encoder: "auto" (placed by
    measurement on this machine), "fp32", "bf16" or "int8". As²d's
    producer: `producer_model` over `chunk_s` chunks, `budget` candidates per verification;
    sd/specasr's prefix-conditioned `drafter`. The decoder runs on `threads` threads while the
    producer drafts beside it (default: every core but one) and on `solo_threads` when nothing does
    (target-only, or once the producer has published the whole recording; default: every core),
    where the self-test finds the rows equal at both counts; else always on `threads`."""

    def __init__(
        self,
        model: str = "whisper-base",
        method: str | Sequence[str] = AUTO,
        *,
        dtype: str = "auto",
        encoder: str = "auto",
        producer_model: str = "whisper-tiny.en",
        chunk_s: float | None = None,
        budget: int | None = None,
        drafter: str = "whisper-tiny.en",
        threads: int | None = None,
        solo_threads: int | None = None,
    ):
        from asyncspec.profiling.deployed import deployed_as2d
        from asyncspec.transcription import loading

        asked = (method,) if isinstance(method, str) else tuple(method)
        self.methods, self.method_note = resolve_auto(asked)
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise InputError(
                f"unknown method {', '.join(unknown) or repr(method)}; choose from {AUTO}, {', '.join(METHODS)}"
            )
        as2d = deployed_as2d(None, chunk_s, budget, required=loading.LONGFORM_PRODUCER)
        self.model, self.method, self.chunk_s, self.budget = model, self.methods[0], as2d.chunk_s, budget
        self.producer_model, self.drafter_name = producer_model, drafter
        self.drafters: dict[str, Any] = {}
        self._owns_models = True
        self.complete_drafting = False  # True: the producer drafts the whole recording (decoupling tests)
        self.as2d_budget = as2d.budget
        producer = None
        if "as2d" in self.methods:  # spawned first: it loads while the target does
            kind = loading.LONGFORM_PRODUCER
            producer = loading.spawn_producer_early(model, kind, as2d.chunk_s, producer_model, dtype)
            self.drafters["as2d"] = producer
        try:
            # loaded, measured (--dtype auto) and self-tested at the thread count it decodes beside
            # the producer with, whatever this process's count is
            with torch_threads(beside_threads(threads)):
                self.target = loading.load_speech_target(model, dtype, encoder)
            if "as2d" in self.methods and producer is None:
                self.drafters["as2d"] = loading.make_producer(
                    loading.LONGFORM_PRODUCER, as2d.chunk_s, producer_model, dtype, self.target
                )
            if PREFIX_DRAFTED & set(self.methods):
                from asyncspec.models.registry import load_decoder

                prefix_drafter = load_decoder(drafter, dtype, engine="transformers")
                self.drafters |= {name: prefix_drafter for name in PREFIX_DRAFTED}
            stacked = DRAW_STACK_BLOCKS if set(self.methods) - {"target"} else None
            self.threads, self.solo_threads = decode_threads(self.target, threads, solo_threads, stacked)
            # as faster-whisper: a multilingual model detects the language unless told it
            self.default_language = None if self.target.multilingual else "en"
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_loaded(
        cls,
        target,
        drafters: dict[str, Any],
        model: str,
        *,
        budget: int | None = None,
        as2d_budget: int | None = None,
        producer_model: str = "whisper-tiny.en",
        drafter: str = "whisper-tiny.en",
    ) -> Transcriber:
        """A transcriber over a target and drafters a service loaded and owns (its As²d producer
        must be the ct2-chunk kind, whose drafts carry audio time); closing it closes none of them.
        The decoder keeps the service's thread count throughout."""
        import torch

        self = cls.__new__(cls)
        self.methods = ("target", *(name for name in METHODS if drafters.get(name) is not None))
        self.model, self.method, self.chunk_s, self.method_note = model, "target", None, None
        self.budget, self.as2d_budget = budget, as2d_budget
        self.producer_model, self.drafter_name = producer_model, drafter
        self.drafters, self.complete_drafting, self.target = dict(drafters), False, target
        self.threads = self.solo_threads = torch.get_num_threads()
        self.default_language = None if target.multilingual else "en"
        self._owns_models = False
        return self

    def describe_threads(self) -> str:
        return f"decoder threads: {self.threads} beside the producer, {self.solo_threads} alone"

    @property
    def producer(self):
        return self.drafters.get("as2d")

    def detect_language(self, audio) -> tuple[str, float, dict[str, float]]:
        """(language, its probability, every language's): Whisper's identification on the first
        30 s, as `transcribe` runs it when no language is given (faster-whisper's detect_language)."""
        return self.target.detect_language(self._first_window(self.load(audio))[1])

    def _first_window(self, samples: np.ndarray):
        """(the first window's audio, its encoder output)."""
        first_audio = window_audio(samples, 0)[0]
        return first_audio, self.target.encode_audio(first_audio)

    def transcribe(
        self,
        audio: str | Path | np.ndarray,
        options: LongformOptions | None = None,
        method: str | None = None,
        check: Callable[[], None] | None = None,
        **overrides: Any,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """Segments (lazily) and the info of a recording: a path, or 16 kHz mono float32 samples.
        Keyword overrides are LongformOptions fields (language, task, initial_prompt, hotwords, temperatures,
        best_of, thresholds, condition_on_previous_text, seed). language None: detected on the
        first window, as faster-whisper does (the default of a multilingual model). `check`: called
        before every target call; what it raises ends the transcription (a service's cancellation)."""
        method = method or self.method
        if method != "target" and method not in self.methods:
            raise InputError(f"this transcriber was not loaded for {method!r} (methods: {', '.join(self.methods)})")
        try:
            options = replace(options or LongformOptions(language=self.default_language), **overrides)
        except TypeError as error:  # an option that does not exist
            raise InputError(f"transcribe: {error}") from None
        samples = self.load(audio)
        duration, speech, pauses = len(samples) / SAMPLE_RATE, None, None
        if options.batch_size is not None or options.vad_filter:
            from asyncspec.transcription.batched import BATCH_VAD
            from asyncspec.transcription.vad import speech_only

            samples, speech = speech_only(samples, BATCH_VAD if options.batch_size is not None else None)
        else:
            from asyncspec.transcription.pauses import pause_note

            pauses = pause_note(samples)
        first_window = None
        probability = 1.0
        if options.language is None and not len(samples):
            options = replace(options, language="en")  # no speech: nothing to detect, nothing to decode
        if options.language is None:
            first_window = self._first_window(samples)
            language, probability, _ = self.target.detect_language(first_window[1])
            options = replace(options, language=language)
        method, notes = runnable(method, options, self.producer_model, self.drafter_name)
        info = TranscriptionInfo(
            language=options.language,
            language_probability=probability,
            duration=duration,
            method=method,
            model=self.model,
            options=options,
            notes=notes + ([pauses] if pauses else []),
            duration_after_vad=None if speech is None else len(samples) / SAMPLE_RATE,
        )
        target = self.target if check is None else _Interruptible(self.target, check)
        segments = self._segments(target, samples, options, info, first_window, speech)
        return (segments if speech is None else in_original_time(segments, speech)), info

    @staticmethod
    def load(audio: str | Path | np.ndarray) -> np.ndarray:
        if isinstance(audio, np.ndarray):
            return validate_samples(np.ascontiguousarray(audio, dtype=np.float32), "audio")
        return load_audio(audio)

    def _segments(
        self, target, samples: np.ndarray, options: LongformOptions, info: TranscriptionInfo, first_window, speech
    ) -> Iterator[Segment]:
        from asyncspec.ondevice.align import token_spelling
        from asyncspec.ondevice.timed_view import FileCandidates
        from asyncspec.transcription.batched import chunk_bounds, transcribe_chunks

        files = None
        if info.method == "as2d":
            rules, spelling = self.target.timestamp_rules, token_spelling(self.target.tokenizer)
            files = FileCandidates(self.producer, samples, rules, spelling)
        try:
            decode = self._window_decoder(target, info.method, files, info.stats)
            encode = self._window_encoder(files, first_window)
            if options.batch_size is None:
                outcomes = transcribe_windows(target, decode, samples, options, encode)
            else:
                batch, bounds = self._batch_decoder(target), chunk_bounds(speech)
                outcomes = transcribe_chunks(target, batch, decode, samples, bounds, options, encode)
            for outcome in outcomes:
                _observe(info, outcome)
                yield from outcome.segments
        finally:
            if files is not None:
                files.close(complete=self.complete_drafting)
                info.stats.producer_failure = files.buffer.failure
                info.publications = [(b.offset, b.tokens, b.start_s, b.end_s) for b in files.buffer.batches]

    def _window_decoder(self, target, method: str, files, stats: TranscriptionStats):
        from asyncspec.decoding.beam_search import decode_beam_search
        from asyncspec.decoding.methods import METHODS as DECODERS
        from asyncspec.decoding.result import DecodeConfig

        budgets = (("as2d", self.as2d_budget),) if self.as2d_budget else ()

        def decode(request, configs: list[DecodeConfig], seek_s: float, end_s: float, earlier) -> list:
            configs = [replace(config, budget=self.budget, method_budgets=budgets) for config in configs]
            alone = files is None or files.drafting_done()
            threads = self.solo_threads if alone else self.threads
            stats.solo_decodes += len(configs) if alone and self.solo_threads != self.threads else 0
            with torch_threads(threads):
                if configs[0].temperature <= 0 and configs[0].beam_size > 1:
                    return [decode_beam_search(target, request, config) for config in configs]
                if configs[0].temperature > 0 and (len(configs) > 1 or method not in POSITIONAL_SAMPLERS):
                    return self._draws(target, method, request, configs, earlier, threads)
                drafter = files.window(seek_s, end_s) if files is not None else self.drafters.get(method)
                return [DECODERS[method](target, drafter, request, config) for config in configs]

        return decode

    def _batch_decoder(self, target):
        """Chunks side by side (transcription/batched.py): their greedy decodes or beam searches in
        shared calls, on every core (nothing drafts beside a batch)."""
        from asyncspec.decoding.beam_search import decode_beam_batch
        from asyncspec.decoding.target_only import decode_target_batch

        def decode(requests, config):
            with torch_threads(self.solo_threads):
                batch = decode_beam_batch if config.beam_size > 1 else decode_target_batch
                return batch(target, requests, config)

        return decode

    def _draws(self, target, method: str, request, configs, earlier: list[list[int]], threads: int) -> list:
        """A fallback temperature's draws, every method's equal to target-only's positional samples:
        target-only decodes them side by side one token per call; the speculative methods verify
        candidates from the window's earlier draws, in calls as wide as the batch check proved."""
        from asyncspec.decoding.speculative_draws import decode_speculative_draws
        from asyncspec.decoding.target_draws import decode_target_draws
        from asyncspec.models.selftest import invariance

        if method == "target":
            return decode_target_draws(target, request, configs)
        return decode_speculative_draws(target, request, configs, earlier, invariance(self.target).stacking(threads))

    def _window_encoder(self, files, first_window=None):
        """The encoder on the decoder's threads while the producer drafts on its own core (measured on
        the long-form set, 2-core EPYC: a first window's encoder on both cores beside the producer took
        2.2 s, against 0.8 s on one), on the placement's once drafting is done. `first_window`:
        (audio, encoder output) already computed for language detection, used once."""
        primed = [first_window] if first_window is not None else []

        def encode(audio: np.ndarray):
            if primed and _same_samples(primed[0][0], audio):
                return primed.pop()[1]
            busy = files is not None and not files.drafting_done()
            return self.target.encode_audio(audio, threads=self.threads if busy else None)

        return encode

    def close(self) -> None:
        if not self._owns_models:
            return
        producer = self.drafters.pop("as2d", None)
        if producer is not None:
            producer.close()

    def __enter__(self) -> Transcriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Interruptible:
    """The target, with `check` called before each of its decoding calls."""

    def __init__(self, target, check: Callable[[], None]):
        self._target, self._check = target, check

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def extend(self, state, tokens):
        self._check()
        return self._target.extend(state, tokens)

    def extend_each(self, states, tokens):
        self._check()
        return self._target.extend_each(states, tokens)

    def extend_packed(self, states, token_lists, most_blocks=1):
        self._check()
        return self._target.extend_packed(states, token_lists, most_blocks)


def _same_samples(a: np.ndarray, b: np.ndarray) -> bool:
    """The same window of the same recording (two views of one array)."""
    return a.shape == b.shape and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _observe(info: TranscriptionInfo, outcome: WindowOutcome) -> None:
    stats = info.stats
    info.windows.append(outcome)
    stats.windows += 1
    stats.fallbacks += outcome.fell_back
    stats.resumed_early += outcome.resumed_early
    stats.decodes += len(outcome.draws)
    stats.prefill_s += outcome.encode_s
    if outcome.skipped:
        stats.skipped.append(outcome.start_s)
    stats.tokens += len(outcome.chosen.result.tokens)
    for attempt in outcome.draws:
        stats.prefill_s += attempt.result.stats.prefill_s
        stats.decode_s += attempt.result.stats.decode_s
