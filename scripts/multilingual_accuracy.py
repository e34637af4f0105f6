"""Language identification, transcription WER and translation WER/BLEU on the multilingual set
(data/multilingual.py: six languages spoken by Festival and espeak-ng, English by Festival), for
asyncspec on its defaults (`language` detected; As²d, which falls back to target-only, with a note,
where its English-only producer cannot draft) and faster-whisper int8 on its defaults (beam 5).
Identification runs on every clip (each system's own detect_language: the first 30 s, as its
transcribe runs it); transcription and translation on the first `--per-language` clips of each
language. Each system runs in a process of its own, one after the other, so that they never share
the cores.

    .venv/bin/python scripts/multilingual_accuracy.py --out docs/results/multilingual.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from asyncspec.benchmarks.languages import ClipOutput, score
from asyncspec.data.multilingual import build_multilingual_set

SYSTEMS = ("asyncspec", "faster-whisper-int8-beam5")


def _asyncspec(detect: list[str], transcribe: list[str]) -> dict:
    from asyncspec import Transcriber

    detected, texts = [], []
    with Transcriber("whisper-base") as transcriber:
        for path in detect:
            language, probability, _ = transcriber.detect_language(path)
            detected.append([language, probability])
            print(f"{Path(path).name}: {language} {probability:.2f}", file=sys.stderr, flush=True)
        for path in transcribe:
            segments, info = transcriber.transcribe(path)
            transcript = " ".join(s.text for s in segments)
            translated, translate_info = transcriber.transcribe(path, task="translate")
            translation = " ".join(s.text for s in translated)
            texts.append(
                {"transcript": transcript, "translation": translation, "notes": info.notes + translate_info.notes}
            )
            print(f"{Path(path).name}: {translation}", file=sys.stderr, flush=True)
    return {"detected": detected, "texts": texts}


def _faster_whisper(detect: list[str], transcribe: list[str], beam_size: int) -> dict:
    from faster_whisper import WhisperModel, decode_audio

    from asyncspec.benchmarks.e2e_systems import ct2_directory

    model = WhisperModel(str(ct2_directory("whisper-base")), device="cpu", compute_type="int8", cpu_threads=2)
    detected, texts = [], []
    for path in detect:
        language, probability, _ = model.detect_language(decode_audio(path))
        detected.append([language, probability])
    for path in transcribe:
        transcript = " ".join(s.text for s in model.transcribe(path, beam_size=beam_size)[0])
        translation = " ".join(s.text for s in model.transcribe(path, beam_size=beam_size, task="translate")[0])
        texts.append({"transcript": transcript, "translation": translation})
    return {"detected": detected, "texts": texts}


def run_child(system: str, detect: list[Path], transcribe: list[Path]) -> tuple[dict, float]:
    command = [sys.executable, __file__, "--child", system, "--detect", *map(str, detect)]
    command += ["--transcribe", *map(str, transcribe)]
    started = time.perf_counter()
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)  # progress on stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), time.perf_counter() - started


def child(system: str, detect: list[str], transcribe: list[str]) -> dict:
    if system == "asyncspec":
        return _asyncspec(detect, transcribe)
    return _faster_whisper(detect, transcribe, int(system.rsplit("beam", 1)[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("multilingual.json"))
    parser.add_argument("--set-dir", type=Path, default=Path.home() / ".cache/asyncspec/multilingual")
    parser.add_argument("--per-language", type=int, default=2, help="clips per language transcribed and translated")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--detect", nargs="*", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--transcribe", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.detect, args.transcribe), ensure_ascii=False))
        return
    clips = build_multilingual_set(args.set_dir)
    subset = [c for c in clips if int(c.path.stem.rsplit("_", 1)[1]) < args.per_language]
    results: dict = {"clips": len(clips), "transcribed_clips": len(subset)}
    for system in SYSTEMS:
        run, wall = run_child(system, [c.path for c in clips], [c.path for c in subset])
        detected = {c.path.stem: (str(d[0]), float(d[1])) for c, d in zip(clips, run["detected"], strict=True)}
        outputs = [
            ClipOutput(detected[c.path.stem][0], detected[c.path.stem][1], t["transcript"], t["translation"])
            for c, t in zip(subset, run["texts"], strict=True)
        ]
        right = sum(detected[c.path.stem][0] == c.language for c in clips)
        results[system] = score(subset, outputs) | {
            "identification_accuracy_all_clips": round(right / len(clips), 4),
            "misidentified": {k: v for k, v in detected.items() if v[0] != k.split("_")[0]},
            "process_wall_s": round(wall, 1),
            "outputs": {c.path.stem: t for c, t in zip(subset, run["texts"], strict=True)},
        }
        summary = {
            k: results[system][k] for k in ("identification_accuracy_all_clips", "translation_wer", "translation_bleu")
        }
        print(system, summary, f"{wall:.1f} s", flush=True)
    args.out.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
