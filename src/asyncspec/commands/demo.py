"""`asyncspec demo`: the main job on built-in defaults — transcribe the bundled LibriVox clips
with the offline Whisper base model and score them against their transcripts."""

from __future__ import annotations

import json
from pathlib import Path

from asyncspec.commands.transcribe import file_windows, transcribe_windows
from asyncspec.datasets import librivox_clips
from asyncspec.decoding.result import DecodeConfig
from asyncspec.text_metrics import word_errors


def run(args) -> int:
    from asyncspec.models.registry import load_decoder

    clips = librivox_clips()
    references = {str(clip.path): clip.transcript for clip in clips}
    windows = file_windows([str(clip.path) for clip in clips])
    target = load_decoder(args.model, args.dtype)
    records = list(transcribe_windows(target, windows, args.methods, DecodeConfig()))
    summary = summarize(records, references)
    for record in records:
        print(f"{Path(record['file']).name} [{record['method']}] {record['tps']:.1f} tok/s: {record['text']}")
    for method, row in summary.items():
        print(
            f"{method}: WER {row['wer'] * 100:.1f}% over {row['reference_words']} words, "
            f"{row['tokens']} tokens in {row['decode_s']:.2f} s = {row['tps']:.1f} tok/s ({args.model}, {args.dtype})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"records": records, "summary": summary}, indent=2))
    return 0


def summarize(records: list[dict], references: dict[str, str]) -> dict[str, dict]:
    """Corpus WER and pooled throughput per method."""
    summary: dict[str, dict] = {}
    for record in records:
        row = summary.setdefault(record["method"], {"errors": 0, "reference_words": 0, "tokens": 0, "decode_s": 0.0})
        errors, words = word_errors(references[record["file"]], record["text"])
        row["errors"] += errors
        row["reference_words"] += words
        row["tokens"] += record["n_tokens"]
        row["decode_s"] += record["decode_s"]
    for row in summary.values():
        row["wer"] = row["errors"] / max(row["reference_words"], 1)
        row["tps"] = row["tokens"] / row["decode_s"] if row["decode_s"] else 0.0
    return summary
