"""`asyncspec transcribe`: audio files -> windows -> one decode per window and method."""

from __future__ import annotations

from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.run.compare import equality_check, methods_to_run, print_summary, run_jobs
from asyncspec.run.config import decode_config
from asyncspec.run.models import load_models
from asyncspec.run.windows import file_windows, window_jobs


def run(args) -> int:
    windows = file_windows(args.audio)
    methods = methods_to_run(args.methods, args.compare)
    args.methods = methods
    config = decode_config(args)
    with load_models(args, WhisperBackend, "speech") as (target, drafters):
        jobs = window_jobs(target, windows, args.language)
        exactness = equality_check(target, config, args.compare)
        records = run_jobs(target, drafters, jobs, methods, config, args.json, args.trace, exactness)
    return print_summary(records, args.json, exactness)
