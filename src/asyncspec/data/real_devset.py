"""A development split of real speech, disjoint from every test window: the CMU recordings of
Debian's pocketsphinx-testdata (not its LibriVox clips, which are the test set), each at three
speaking rates.

Festival's synthetic split ranked the producers differently from real speech (issue #29: it chose
the autoregressive producer, 10 % slower on the LibriVox windows). These are people speaking:
card names, commands and numbers, digits. There is little of it (22 s), so each recording is also
spoken faster and slower (sox's tempo: pitch kept), and a window's recording is kept with it so
that cross-validation never scores a rate of a recording that it selected on."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from asyncspec.errors import InputError

CMU_DATA = Path("/usr/share/pocketsphinx/test/data")
# recording -> its files, joined with short pauses into one window
CMU_RECORDINGS = {
    "cards": tuple(f"cards/00{i}.wav" for i in range(1, 6)),
    "commands": ("goforward.raw", "numbers.raw", "something.raw"),
    "digits": ("tidigits/dhd.2934z.raw",),
}
TEMPOS = (0.85, 1.0, 1.15)
PAUSE_S = 0.4
RAW_FORMAT = ("-t", "raw", "-r", "16000", "-e", "signed", "-b", "16", "-c", "1")  # the CMU .raw files


def assemble_real_dev_set(directory: Path) -> list[Path]:
    """One WAV per (recording, tempo): `{recording}-tempo{t}.wav`; reused when already there."""
    if shutil.which("sox") is None:
        raise InputError("sox is not installed (apt-get install sox)")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for recording, files in CMU_RECORDINGS.items():
        sources = [CMU_DATA / name for name in files]
        missing = [str(p) for p in sources if not p.exists()]
        if missing:
            raise InputError(f"{missing[0]}: not found (apt-get install pocketsphinx-testdata)")
        for tempo in TEMPOS:
            path = directory / f"{recording}-tempo{tempo:g}.wav"
            if not path.exists():
                _join(sources, tempo, path)
            paths.append(path)
    return paths


def _join(sources: list[Path], tempo: float, path: Path) -> None:
    """The files one after another with a pause after each, at the tempo."""
    pause = path.with_name("pause.wav")
    _sox(["-n", "-r", "16000", "-c", "1", "-b", "16", str(pause), "trim", "0", str(PAUSE_S)], path)
    inputs: list[str] = []
    for source in sources:
        inputs += [*RAW_FORMAT, str(source)] if source.suffix == ".raw" else [str(source)]
        inputs.append(str(pause))
    _sox([*inputs, "-r", "16000", "-c", "1", "-b", "16", str(path), "tempo", "-s", str(tempo)], path)
    pause.unlink()


def _sox(arguments: list[str], path: Path) -> None:
    done = subprocess.run(["sox", *arguments], capture_output=True, text=True)
    if done.returncode != 0:
        raise InputError(f"sox could not assemble {path.name}: {done.stderr[-300:]}")


def recording_of(window: str) -> str:
    """The recording a development window comes from (`cards-tempo0.85.wav#0` -> `cards`)."""
    return window.split("-tempo")[0]
