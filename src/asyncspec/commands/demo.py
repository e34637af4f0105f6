"""`asyncspec demo`: the main job on built-in defaults — transcribe the bundled LibriVox clips
with the offline Whisper base target, target-only and each speculative method side by side,
checked token for token against target-only and scored against the reference transcripts."""

from __future__ import annotations

from asyncspec.data.librivox import librivox_clips
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.run.compare import equality_check, methods_to_run, print_summary, run_jobs
from asyncspec.run.models import load_models
from asyncspec.run.options import DecodingOptions, decode_config
from asyncspec.run.windows import file_windows, window_jobs
from asyncspec.text_metrics import word_errors


def run(args) -> int:
    options = DecodingOptions.from_args(args)
    clips = librivox_clips()
    references = {str(clip.path): clip.transcript for clip in clips}
    windows = file_windows([str(clip.path) for clip in clips])
    options = options.running(methods_to_run(options.methods, compare=True))
    config = decode_config(options)
    with load_models(options, WhisperBackend, "speech") as (target, drafters):
        exactness = equality_check(target, config, compare=True)
        jobs = window_jobs(target, windows)
        records = run_jobs(target, drafters, jobs, options.methods, config, exactness=exactness)
    wer = word_error_rates(records, references)
    exit_code = print_summary(records, exactness, args.json, wer=wer, as2d=options.as2d_record())
    for method, rate in wer.items():
        print(f"{method}: WER {rate * 100:.1f}% against the LibriVox transcripts ({options.model}, {options.dtype})")
    return exit_code


def word_error_rates(records: list[dict], references: dict[str, str]) -> dict[str, float]:
    """Corpus WER per method (word edits summed over clips / reference words)."""
    totals: dict[str, list[int]] = {}
    for record in records:
        errors, words = word_errors(references[record["file"]], record["text"])
        pair = totals.setdefault(record["method"], [0, 0])
        pair[0] += errors
        pair[1] += words
    return {method: errors / max(words, 1) for method, (errors, words) in totals.items()}
