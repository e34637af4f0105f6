"""Word recall on recordings with long silences: readers.wav's pieces (the long-form set) with G s of
room tone before, between and after them, for each gap G and noise seed, transcribed by asyncspec
(target-only; every method gives the same tokens) and faster-whisper int8 (beam 1, its long-form
defaults otherwise), each with and without VAD. Each system runs in its own process, one after the
other, so that they never share the two cores.

    .venv/bin/python scripts/gapped_recall.py --out docs/results/gapped_recall.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asyncspec.data.longform_set import build_longform_set, with_gaps

GAPS_S = (6, 10, 14)
SEEDS = (1, 2)
SYSTEMS = ("asyncspec-int8", "asyncspec-fp32", "faster-whisper-int8")


def build_variants(directory: Path) -> tuple[list[Path], str]:
    """The gapped recordings and their reference (the same for every variant)."""
    longform = directory / "longform"
    build_longform_set(longform)
    paths = []
    for gap_s in GAPS_S:
        for seed in SEEDS:
            path, reference = with_gaps(longform / "readers.wav", gap_s, seed, directory / f"gap{gap_s}_seed{seed}.wav")
            paths.append(path)
    return paths, reference


def transcribe_all(system: str, paths: list[str], vad: bool) -> list[str]:
    """The text of every recording, in one process (the models loaded once)."""
    if system.startswith("asyncspec"):
        from asyncspec import Transcriber

        dtype = system.removeprefix("asyncspec-")
        encoder = "fp32" if dtype == "fp32" else "auto"
        with Transcriber("whisper-base", "target", dtype=dtype, encoder=encoder) as transcriber:
            return [" ".join(s.text for s in transcriber.transcribe(p, vad_filter=vad)[0]) for p in paths]
    from faster_whisper import WhisperModel

    from asyncspec.benchmarks.e2e_systems import ct2_directory

    model = WhisperModel(str(ct2_directory("whisper-base")), device="cpu", compute_type="int8", cpu_threads=2)
    return [" ".join(s.text for s in model.transcribe(p, beam_size=1, language="en", vad_filter=vad)[0]) for p in paths]


def run_child(system: str, paths: list[Path], vad: bool) -> tuple[list[str], float]:
    command = [sys.executable, __file__, "--child", system, "--vad" if vad else "--no-vad", *map(str, paths)]
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gapped_recall.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--vad", action=argparse.BooleanOptionalAction, default=False, help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(transcribe_all(args.child, args.paths, args.vad)))
        return
    from asyncspec.text_metrics import word_errors, word_recall

    with tempfile.TemporaryDirectory(prefix="asyncspec-gapped-") as scratch:
        paths, reference = build_variants(Path(scratch))
        results: dict = {}
        for system in SYSTEMS:
            for vad in (False, True):
                texts, wall = run_child(system, paths, vad)
                rows = {}
                for path, text in zip(paths, texts, strict=True):
                    errors, words = word_errors(reference, text)
                    recall = word_recall(reference, text)
                    rows[path.stem] = {"recall": round(recall, 4), "wer": round(errors / words, 4)}
                name = system + (" vad" if vad else "")
                mean = sum(row["recall"] for row in rows.values()) / len(rows)
                results[name] = {"files": rows, "mean_recall": round(mean, 4), "process_wall_s": round(wall, 1)}
                print(f"{name}: mean recall {mean:.3f}", {k: v["recall"] for k, v in rows.items()}, flush=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
