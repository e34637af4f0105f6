"""What `--vad` saves in wall time, and why: the long-form set's three recordings with G s of room
tone before, between and after their pieces (over 30 % silence), transcribed with and without VAD
by asyncspec As²d (its defaults), asyncspec target-only (the reference As²d must equal, window for
window) and faster-whisper int8 on its defaults (beam 5; `vad_filter` for VAD). Per file: the
transcribe call's wall (models loaded once per process, warm), WER, and where the time goes
(windows decoded, skipped as silent, fallen back, draws). Each system runs in its own process, one
after the other, so that they never share the two cores.

    .venv/bin/python scripts/vad_wall.py --out docs/results/vad_wall.json
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

SYSTEMS = ("asyncspec-as2d", "asyncspec-target", "faster-whisper-int8")


def gapped(directory: Path, gap_s: float, seed: int = 1) -> list[tuple[Path, str]]:
    """Each long-form recording's pieces with `gap_s` of room tone around them, and its reference."""
    recordings = build_longform_set(directory / "longform")
    return [with_gaps(r, gap_s, seed, directory / f"{r.stem}_gap{gap_s:g}.wav") for r in recordings]


def _asyncspec_file(transcriber, path: str, method: str, vad: bool) -> dict:
    started = time.perf_counter()
    segments, info = transcriber.transcribe(path, method=method, vad_filter=vad)
    text = " ".join(s.text for s in segments)
    wall = time.perf_counter() - started
    windows = info.windows
    return {
        "wall_s": round(wall, 3),
        "text": text,
        "audio_s": round(info.duration, 2),
        "transcribed_s": round(info.duration_after_vad or info.duration, 2),
        "windows": len(windows),
        "skipped": sum(w.skipped for w in windows),
        "fell_back": sum(w.fell_back for w in windows),
        "draws": sum(len(w.draws) or len(w.attempts) for w in windows),
        "tokens": info.stats.tokens,
        "method": info.method,
        "chosen": [[w.seek, list(w.chosen.result.tokens)] for w in windows],  # for the equality check
    }


def _faster_whisper_file(model, path: str, vad: bool) -> dict:
    started = time.perf_counter()
    segments, info = model.transcribe(path, vad_filter=vad)
    text = " ".join(s.text for s in segments)
    wall = time.perf_counter() - started
    return {
        "wall_s": round(wall, 3),
        "text": text,
        "audio_s": round(info.duration, 2),
        "transcribed_s": round(info.duration_after_vad or info.duration, 2),
    }


def transcribe_all(system: str, paths: list[str]) -> list[dict]:
    """Every file without then with VAD, in one process (the models loaded once, a warm-up first)."""
    rows = []
    if system.startswith("asyncspec"):
        from asyncspec import Transcriber

        method = system.removeprefix("asyncspec-")
        with Transcriber("whisper-base") as transcriber:
            _asyncspec_file(transcriber, paths[0], method, False)  # warm-up: first calls at each shape
            for path in paths:
                rows += [_asyncspec_file(transcriber, path, method, vad) for vad in (False, True)]
        return rows
    from faster_whisper import WhisperModel

    from asyncspec.benchmarks.e2e_systems import ct2_directory

    model = WhisperModel(str(ct2_directory("whisper-base")), device="cpu", compute_type="int8", cpu_threads=2)
    _faster_whisper_file(model, paths[0], False)
    for path in paths:
        rows += [_faster_whisper_file(model, path, vad) for vad in (False, True)]
    return rows


def run_child(system: str, paths: list[Path]) -> list[dict]:
    command = [sys.executable, __file__, "--child", system, *map(str, paths)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(results: dict, files: list[tuple[Path, str]]) -> dict:
    """Per system and file: wall and WER with and without VAD, the saving against the audio removed."""
    from asyncspec.text_metrics import word_errors

    table: dict = {}
    for system, rows in results.items():
        for index, (path, reference) in enumerate(files):
            plain, vad = rows[2 * index], rows[2 * index + 1]
            wer = {}
            for name, row in (("plain", plain), ("vad", vad)):
                errors, words = word_errors(reference, row["text"])
                wer[name] = round(100 * errors / words, 2)
            table.setdefault(system, {})[path.stem] = {
                "audio_removed_pct": round(100 * (1 - vad["transcribed_s"] / plain["audio_s"]), 1),
                "wall_saved_pct": round(100 * (1 - vad["wall_s"] / plain["wall_s"]), 1),
                "wall_s": [plain["wall_s"], vad["wall_s"]],
                "wer_pct": [wer["plain"], wer["vad"]],
            }
    return table


def equal_to_target(results: dict) -> list[str]:
    """Every As²d decode's windows against target-only's: the differing ones, named."""
    differing = []
    for index, (mine, reference) in enumerate(zip(results["asyncspec-as2d"], results["asyncspec-target"], strict=True)):
        if mine["chosen"] != reference["chosen"]:
            differing.append(f"file {index // 2} {'vad' if index % 2 else 'plain'}")
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("vad_wall.json"))
    parser.add_argument("--gap-s", type=float, default=10.0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(transcribe_all(args.child, args.paths)))
        return
    with tempfile.TemporaryDirectory(prefix="asyncspec-vad-") as scratch:
        files = gapped(Path(scratch), args.gap_s)
        results = {system: run_child(system, [path for path, _ in files]) for system in SYSTEMS}
    summary = summarise(results, files)
    differing = equal_to_target(results)
    print(json.dumps(summary, indent=1))
    print("As²d equal to target-only on every decode" if not differing else f"DIFFERING: {differing}")
    report = {"gap_s": args.gap_s, "summary": summary, "as2d_differing": differing, "runs": results}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
