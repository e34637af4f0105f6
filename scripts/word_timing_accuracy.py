"""Word-start error against Festival's own word times: asyncspec (As²d and target-only, which must
agree word for word) beside faster-whisper int8 with word_timestamps=True, Whisper base, on
Pride and Prejudice passages in Festival's two voices.

    .venv/bin/python scripts/word_timing_accuracy.py --out docs/results/word_timing_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from asyncspec.benchmarks.word_timing import start_errors, summary
from asyncspec.data.timed_words import timed_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("word_timing_accuracy.json"))
    parser.add_argument("--passages", type=int, default=6)
    args = parser.parse_args()
    from faster_whisper import WhisperModel

    from asyncspec import Transcriber
    from asyncspec.benchmarks.e2e_systems import ct2_directory

    with tempfile.TemporaryDirectory(prefix="asyncspec-timed-") as scratch:
        files = timed_set(Path(scratch), args.passages)
        errors: dict[str, list[float]] = {"asyncspec": [], "faster-whisper int8": []}
        equal = True
        with Transcriber("whisper-base", ("as2d", "target")) as transcriber:
            for path, _, truth in files:
                timed = {}
                for method in ("as2d", "target"):
                    segments, _ = transcriber.transcribe(path, method=method, language="en", word_timestamps=True)
                    timed[method] = [(w.word, w.start, w.end) for s in segments for w in s.words or ()]
                equal = equal and timed["as2d"] == timed["target"]
                errors["asyncspec"] += start_errors(timed["as2d"], truth)
        model = WhisperModel(str(ct2_directory("whisper-base")), device="cpu", compute_type="int8", cpu_threads=2)
        for path, _, truth in files:
            segments, _ = model.transcribe(str(path), beam_size=1, language="en", word_timestamps=True)
            words = [(w.word, w.start, w.end) for s in segments for w in s.words or ()]
            errors["faster-whisper int8"] += start_errors(words, truth)
        reference_words = sum(len(truth) for _, _, truth in files)
    result: dict = {name: summary(found, reference_words) for name, found in errors.items()}
    result["as2d equals target-only"] = equal
    result["files"] = len(files)
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
