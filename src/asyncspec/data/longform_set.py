"""The long-form evaluation set: three recordings of 2-3 minutes, each with several voices,
pauses of 0.3-4 s and speaker changes, one of them a two-voice theatre dialogue (the scripts:
`longform_texts.py`); `LARGE_RECORDINGS` adds five more (`longform_extra_texts.py`). Built for
`bench e2e`, where a transcriber must not lose speech across its 30 s windows: the case short clips
never test.

Each recording `<name>.wav` (16 kHz mono PCM-16) comes with `<name>.txt`, the exact spoken text
(the reference), and `<name>.json`, its pieces with start and end times, voices and sources. The
build is deterministic (the same script, the same voices, a seeded noise floor) and is reused
while the JSON's `script_sha256` matches the script; otherwise it is built again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np
import soundfile

from asyncspec.audio import SAMPLE_RATE, load_audio
from asyncspec.data.librivox import read_transcription
from asyncspec.data.longform_extra_texts import EXTRA_RECORDINGS
from asyncspec.data.longform_texts import RECORDINGS, Piece
from asyncspec.errors import InputError

TEST_DATA = Path("/usr/share/pocketsphinx/test/data")
# Recordings of pocketsphinx-testdata that have no transcription listing: goforward's text is the one
# sentence of goforward.gram (the grammar pocketsphinx's tests decode it with), and TIDIGITS names a
# recording by its digits (z = zero, o = oh).
KNOWN_TEXTS = {"goforward.raw": "go forward ten meters", "tidigits/dhd.2934z.raw": "two nine three four zero"}
LISTINGS = {"librivox": "transcription", "cards": "cards.transcription"}
FRAME = 320  # 20 ms at 16 kHz: the unit silence is measured in
QUIET_DB = -40.0
PEAK = 0.6  # every piece is brought to the same peak, so that a voice change is not a level jump
NOISE_FLOOR = 3e-4  # room tone (about -70 dBFS RMS) under everything: real pauses are never digital zero
ESPEAK_WPM = 150
PACKAGES = "pocketsphinx-testdata festival festvox-us-slt-hts festvox-kallpc16k espeak-ng"
BUILD_VERSION = 1  # bump when the build itself (not the script) changes what it writes

Recordings = dict[str, tuple[Piece, ...]]
LARGE_RECORDINGS: Recordings = RECORDINGS | EXTRA_RECORDINGS


def longform_files(directory: Path, recordings: Recordings = RECORDINGS) -> list[tuple[Path, str]]:
    """(wav path, reference text) for every recording, built into `directory` when missing."""
    return [(path, path.with_suffix(".txt").read_text()) for path in build_longform_set(directory, recordings)]


def build_longform_set(directory: Path, recordings: Recordings = RECORDINGS) -> list[Path]:
    """The recordings' WAV paths in a fixed order; each is built unless a current one is there.
    `LARGE_RECORDINGS` adds five (longform_extra_texts.py) for quality comparisons."""
    directory.mkdir(parents=True, exist_ok=True)
    return [_ensure(directory, name, script) for name, script in recordings.items()]


def script_digest(name: str, script: tuple[Piece, ...]) -> str:
    text = json.dumps([BUILD_VERSION, name, [asdict(piece) for piece in script]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _ensure(directory: Path, name: str, script: tuple[Piece, ...]) -> Path:
    wav, manifest = directory / f"{name}.wav", directory / f"{name}.json"
    digest = script_digest(name, script)
    if wav.is_file() and manifest.is_file() and (directory / f"{name}.txt").is_file():
        if json.loads(manifest.read_text()).get("script_sha256") == digest:
            return wav
    _check_tools()
    audio, pieces = _assemble(name, script)
    record = {"name": name, "script_sha256": digest, "sample_rate": SAMPLE_RATE}
    record |= {"duration_s": round(len(audio) / SAMPLE_RATE, 3), "silence_share": round(silence_share(audio), 3)}
    record |= {"scripted_pauses_s": round(sum(piece.pause_s for piece in script), 1)}
    record["pieces"] = pieces
    # Each written beside and renamed, the JSON (which marks the build current) last, so an
    # interrupted build is never taken for a finished one.
    reference = "\n".join(piece["text"] for piece in pieces) + "\n"
    _write_atomically(wav, lambda path: soundfile.write(str(path), audio, SAMPLE_RATE, subtype="PCM_16"))
    _write_atomically(directory / f"{name}.txt", lambda path: path.write_text(reference))
    _write_atomically(manifest, lambda path: path.write_text(json.dumps(record, indent=1) + "\n"))
    return wav


def _assemble(name: str, script: tuple[Piece, ...]) -> tuple[np.ndarray, list[dict]]:
    chunks: list[np.ndarray] = []
    pieces, at = [], 0
    with tempfile.TemporaryDirectory(prefix="asyncspec-longform-") as scratch:
        for index, piece in enumerate(script):
            samples, text, source = _render(piece, Path(scratch) / f"{index}.wav")
            start, at = at, at + len(samples)
            pieces.append(
                {"start_s": start / SAMPLE_RATE, "end_s": at / SAMPLE_RATE, "voice": _voice_name(piece)}
                | {"source": source, "text": text, "pause_after_s": piece.pause_s}
            )
            chunks += [samples, np.zeros(round(piece.pause_s * SAMPLE_RATE), dtype=np.float32)]
            at += len(chunks[-1])
    audio = np.concatenate(chunks)
    # Seeded by the name, so every build of a recording has the same noise, sample for sample.
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    audio = audio + rng.normal(0.0, NOISE_FLOOR, audio.size).astype(np.float32)
    return np.clip(audio, -1.0, 1.0).astype(np.float32), pieces


def _render(piece: Piece, scratch: Path) -> tuple[np.ndarray, str, str]:
    """(samples at 16 kHz, the text spoken, where the audio came from)."""
    if piece.voice.startswith("file:"):
        relative = piece.voice.removeprefix("file:")
        samples, source = _read_recording(TEST_DATA / relative), f"pocketsphinx-testdata:{relative}"
        text = file_transcript(relative)
    elif piece.voice.startswith("espeak:"):
        voice = piece.voice.removeprefix("espeak:")
        command = ["espeak-ng", "-v", voice, "-s", str(ESPEAK_WPM), "-w", str(scratch), piece.text]
        subprocess.run(command, check=True, capture_output=True)
        samples, text, source = load_audio(scratch), piece.text, f"espeak-ng {voice}"
    else:
        from asyncspec.data.devset import FESTIVAL_VOICES

        command = ["text2wave", "-eval", FESTIVAL_VOICES[piece.voice], "-o", str(scratch)]
        subprocess.run(command, input=piece.text.encode(), check=True, capture_output=True)
        samples, text, source = load_audio(scratch), piece.text, f"festival {piece.voice}"
    peak = float(np.max(np.abs(samples))) or 1.0
    return _trim((samples * (PEAK / peak)).astype(np.float32)), text, source


def quiet_frames(samples: np.ndarray, threshold_db: float = QUIET_DB) -> np.ndarray:
    """Per 20 ms frame: is its RMS below `threshold_db` re full scale (pieces peak at -4.4 dB)?"""
    usable = len(samples) // FRAME * FRAME
    rms = np.sqrt(np.mean(np.square(samples[:usable].reshape(-1, FRAME), dtype=np.float64), axis=1))
    return rms < 10 ** (threshold_db / 20)


def silence_share(samples: np.ndarray) -> float:
    """The share of quiet frames: the pauses and also the gaps within speech (stops, breaths)."""
    quiet = quiet_frames(samples)
    return float(np.mean(quiet)) if quiet.size else 0.0


def longest_silence_s(samples: np.ndarray) -> float:
    """The longest run of quiet frames, in seconds."""
    longest = run = 0
    for quiet in quiet_frames(samples):
        run = run + 1 if quiet else 0
        longest = max(longest, run)
    return longest * FRAME / SAMPLE_RATE


def _trim(samples: np.ndarray, margin_s: float = 0.05) -> np.ndarray:
    """Without the leading and trailing silence a synthesiser or a recorder leaves (up to 0.6 s
    here), less a 50 ms margin, so that the script's pause is the pause heard."""
    loud = np.nonzero(~quiet_frames(samples))[0]
    if loud.size == 0:
        return samples
    margin = round(margin_s * SAMPLE_RATE)
    start, end = max(0, loud[0] * FRAME - margin), min(len(samples), (loud[-1] + 1) * FRAME + margin)
    return samples[start:end]


def _voice_name(piece: Piece) -> str:
    """Who speaks: the real recordings are named by their speaker set, not by file."""
    if piece.voice.startswith("file:"):
        return "cmu-" + piece.voice.removeprefix("file:").split("/")[0].split(".")[0]
    return piece.voice


def _read_recording(path: Path) -> np.ndarray:
    # The .raw files are headerless 16 kHz 16-bit little-endian mono, as pocketsphinx reads them.
    if path.suffix == ".raw":
        return (np.fromfile(path, dtype="<i2").astype(np.float32) / 32768.0).astype(np.float32)
    return load_audio(path)


def file_transcript(relative: str) -> str:
    """The transcription of a pocketsphinx-testdata recording, from its own listing."""
    if relative in KNOWN_TEXTS:
        return KNOWN_TEXTS[relative]
    folder, _, filename = relative.rpartition("/")
    clips = read_transcription(TEST_DATA / folder / LISTINGS[folder], TEST_DATA / folder)
    texts = {clip.path.name: clip.transcript for clip in clips}
    if filename not in texts:
        raise InputError(f"{relative}: not in {folder}'s transcription")
    return texts[filename]


def _check_tools() -> None:
    missing = [tool for tool in ("text2wave", "espeak-ng") if shutil.which(tool) is None]
    if missing or not TEST_DATA.is_dir():
        raise InputError(
            f"building the long-form set needs {', '.join(missing) or TEST_DATA} (apt-get install {PACKAGES})"
        )


def _write_atomically(path: Path, write) -> None:
    partial = path.with_name(f".{path.name}.partial{path.suffix}")
    write(partial)
    partial.replace(path)


def with_gaps(recording: Path, gap_s: float, seed: int, out: Path) -> tuple[Path, str]:
    """A long-form recording's pieces with `gap_s` of room tone before, between and after them,
    written to `out`, and its reference (the pieces' texts): the set with long silences."""
    audio, rate = soundfile.read(recording, dtype="float32")
    manifest = json.loads(recording.with_suffix(".json").read_text())
    gap = np.zeros(round(gap_s * rate), dtype=np.float32)
    pieces = [audio[round(p["start_s"] * rate) : round(p["end_s"] * rate)] for p in manifest["pieces"]]
    joined = np.concatenate([gap] + [part for piece in pieces for part in (piece, gap)])
    tone = np.random.default_rng(seed).normal(0, NOISE_FLOOR, joined.size).astype(np.float32)
    soundfile.write(out, joined + tone * (joined == 0), rate, subtype="PCM_16")
    return out, "\n".join(piece["text"] for piece in manifest["pieces"])
