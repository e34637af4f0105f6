"""`asyncspec transcribe`: audio files -> windows -> one decode per window and method."""

from __future__ import annotations

from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.run.compare import equality_check, methods_to_run, print_summary, run_jobs
from asyncspec.run.models import load_models
from asyncspec.run.options import DecodingOptions, decode_config
from asyncspec.run.windows import file_windows, window_jobs


def run(args) -> int:
    options = DecodingOptions.from_args(args)  # bad options fail before any file is read
    windows = file_windows(args.audio)
    options = options.running(methods_to_run(options.methods, options.compare))
    config = decode_config(options)
    with load_models(options, WhisperBackend, "speech") as (target, drafters):
        if options.methods == ["as2d"]:  # alone (no reference decoding between its windows to flatter it)
            drafters["as2d"].arrive([window.samples for _, window in windows])  # every window has arrived
        jobs = window_jobs(target, windows, args.language)
        exactness = equality_check(target, config, options.compare)
        records = run_jobs(target, drafters, jobs, options.methods, config, options.trace, exactness)
    return print_summary(records, exactness, args.json)
