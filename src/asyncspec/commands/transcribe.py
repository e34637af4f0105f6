"""`asyncspec transcribe`: recordings -> timed segments (Whisper's long-form algorithm, As²d by
default): the text on stdout, subtitle and data files with --output-dir, every method checked
against target-only with --compare."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from asyncspec.audio import load_audio
from asyncspec.errors import InputError
from asyncspec.run.compare import equality_check, methods_to_run, print_summary, save_traces
from asyncspec.run.options import DecodingOptions, decode_config
from asyncspec.transcription.loading import LONGFORM_PRODUCER
from asyncspec.transcription.longform import LongformOptions
from asyncspec.transcription.outputs import parse_formats, write_outputs


def run(args) -> int:
    # bad options fail before any file is read; a deployed producer of another kind is ignored
    options = DecodingOptions.from_args(args, required_producer=LONGFORM_PRODUCER)
    config = decode_config(options)  # checks --budget and --temperature
    longform = longform_options(args)
    formats = parse_formats(args.output_format) if args.output_dir else []
    if options.producer != LONGFORM_PRODUCER and "as2d" in options.methods:  # asked for on the command line
        raise InputError(f"long-form As²d drafts with the {LONGFORM_PRODUCER} producer (its drafts carry audio time)")
    audio = [(path, load_audio(path)) for path in args.audio]  # every file validated before any decoding
    methods = methods_to_run(options.methods, options.compare)
    output_dir = Path(args.output_dir) if args.output_dir else None
    plan = _Run(methods, options.methods[0], longform, formats, output_dir, options.trace, args.highlight_words)
    from asyncspec.transcription.api import Transcriber

    with Transcriber(
        options.model or "whisper-base",
        methods,
        dtype=options.dtype,
        encoder=options.encoder,
        producer_model=options.producer_model,
        chunk_s=options.chunk_s,
        budget=options.budget,
        drafter=options.drafter or "whisper-tiny.en",
        threads=args.threads,
        solo_threads=args.solo_threads,
    ) as transcriber:
        chosen = f"; {options.method_note}" if options.method_note else ""
        print(f"{transcriber.target.describe()}; {transcriber.describe_threads()}{chosen}", file=sys.stderr)
        exactness = equality_check(transcriber.target, config, options.compare)
        records: list[dict] = []
        decoded: list = []
        for path, samples in audio:
            records += _transcribe_file(transcriber, path, samples, plan, exactness, decoded)
    if plan.trace:
        save_traces(plan.trace, decoded)
    return print_summary(records, exactness, args.json, as2d=options.as2d_record())


@dataclass(frozen=True)
class _Run:
    methods: list[str]  # target-only first when compared
    shown: str  # the method whose text is printed and written
    longform: LongformOptions
    formats: list[str]
    output_dir: Path | None
    trace: str | None  # save every chosen window decode's stage events here
    highlight_words: bool = False  # SRT/VTT: a cue per word


def _transcribe_file(transcriber, path: str, samples, run: _Run, exactness, decoded: list) -> list[dict]:
    from asyncspec.run.longform import check_windows, stream_segments, window_records

    infos, kept = {}, {}
    for method in run.methods:
        segments, info = transcriber.transcribe(samples, run.longform, method=method)
        kept[method] = stream_segments(segments, info, Path(path).name, echo=method == run.shown)
        infos[method] = info
        decoded += [({"file": path, "window": w.index, "start_s": w.start_s}, w.chosen.result) for w in info.windows]
    if exactness is not None:
        for method in run.methods[1:]:
            check_windows(exactness, path, method, infos["target"], infos[method])
    if run.output_dir is not None:
        info = infos[run.shown]
        details = {"language": info.language, "duration": info.duration, "method": run.shown, "model": info.model}
        highlight = run.longform.word_timestamps and run.highlight_words
        written = write_outputs(kept[run.shown], details, path, run.output_dir, run.formats, highlight)
        print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    return window_records(path, infos, transcriber.target, exactness is not None)


def longform_options(args) -> LongformOptions:
    increment = args.temperature_increment_on_fallback
    if increment < 0 or args.temperature < 0:
        raise InputError("--temperature and --temperature-increment-on-fallback must be >= 0")
    temperatures = (args.temperature,)
    if increment > 0:
        steps = int(round((1.0 - args.temperature) / increment))
        temperatures = tuple(round(args.temperature + i * increment, 6) for i in range(steps + 1)) or (
            args.temperature,
        )
    if args.best_of < 1:
        raise InputError(f"--best-of must be at least 1, got {args.best_of}")
    if args.beam_size < 1:
        raise InputError(f"--beam-size must be at least 1, got {args.beam_size}")
    if args.patience <= 0:
        raise InputError(f"--patience must be above 0, got {args.patience}")
    if args.batch_size is not None and args.batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {args.batch_size}")
    return LongformOptions(
        language=None if args.language == "auto" else args.language,
        task=args.task,
        initial_prompt=args.initial_prompt,
        hotwords=args.hotwords,
        vad_filter=args.vad,
        word_timestamps=args.word_timestamps or args.highlight_words,
        temperatures=temperatures,
        best_of=args.best_of,
        beam_size=args.beam_size,
        batch_size=args.batch_size,
        patience=args.patience,
        length_penalty=args.length_penalty,
        compression_ratio_threshold=args.compression_ratio_threshold,
        log_prob_threshold=args.logprob_threshold,
        no_speech_threshold=args.no_speech_threshold,
        condition_on_previous_text=args.condition_on_previous_text,
        resume_after_early_end=args.resume_after_early_end,
        seed=args.seed,
    )
