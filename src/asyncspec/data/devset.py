"""A synthetic development set: public-domain prose spoken by Festival's voices, disjoint from the
LibriVox test clips (Austen's Pride and Prejudice, 1813, not Sense and Sensibility).

Festival's HTS (cmu_us_slt_arctic) and diphone (kal) voices, not espeak-ng: measured here, the
tiny.en producer agrees with Whisper base on espeak-ng speech far less than on read speech
(As²d 1.07x vs 1.35x on the same passages), so an espeak-ng split steered the budget selection
towards budgets that are poor on real speech. espeak-ng still speaks the calibration window."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from asyncspec.errors import InputError

PRIDE_AND_PREJUDICE = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood, "
    "this truth is so well fixed in the minds of the surrounding families, that he is considered as the "
    "rightful property of some one or other of their daughters.",
    "My dear Mr. Bennet, said his lady to him one day, have you heard that Netherfield Park is let at last?",
    "Mr. Bennet replied that he had not.",
    "But it is, returned she; for Mrs. Long has just been here, and she told me all about it.",
    "Mr. Bennet made no answer.",
    "Do you not want to know who has taken it? cried his wife impatiently.",
    "You want to tell me, and I have no objection to hearing it.",
    "This was invitation enough.",
    "Why, my dear, you must know, Mrs. Long says that Netherfield is taken by a young man of large fortune "
    "from the north of England; that he came down on Monday in a chaise and four to see the place, and was "
    "so much delighted with it, that he agreed with Mr. Morris immediately.",
    "He is to take possession before Michaelmas, and some of his servants are to be in the house by the end "
    "of next week.",
    "What is his name? Bingley. Is he married or single? Oh! Single, my dear, to be sure!",
)
FESTIVAL_VOICES = {"slt": "(voice_cmu_us_slt_arctic_hts)", "kal": "(voice_kal_diphone)"}
FESTIVAL_PACKAGES = "festival festvox-us-slt-hts festvox-kallpc16k"


def synthesize_dev_set(directory: Path) -> list[Path]:
    """One WAV per (voice, pair of passages), ~8-24 s each; reused when already there."""
    directory.mkdir(parents=True, exist_ok=True)
    texts = [" ".join(PRIDE_AND_PREJUDICE[i : i + 2]) for i in range(0, len(PRIDE_AND_PREJUDICE), 2)]
    paths = []
    for voice, select in FESTIVAL_VOICES.items():
        for index, text in enumerate(texts):
            paths.append(festival_speak(directory / f"pride-{voice}-{index}.wav", text, select))
    return paths


def festival_speak(path: Path, text: str, select: str, encoding: str = "utf-8", packages: str = "") -> Path:
    """Festival's `text2wave` of `text` in the voice `select` chooses, unless already at `path`;
    `encoding`: the text encoding the voice reads (the Italian and Finnish diphone voices: Latin-1)."""
    if shutil.which("text2wave") is None:
        raise InputError(
            f"Festival is not installed (apt-get install {f'festival {packages}' if packages else FESTIVAL_PACKAGES})"
        )
    if not path.exists():
        command = ["text2wave", "-eval", select, "-o", str(path)]
        done = subprocess.run(command, input=text.encode(encoding), capture_output=True)
        if done.returncode != 0 or not path.exists():
            hint = f" (apt-get install {packages})" if packages else ""
            raise InputError(f"Festival could not speak with {select}{hint}: {done.stderr.decode()[-300:]}")
    return path


def speak(path: Path, text: str, voice: str, words_per_minute: int) -> Path:
    """espeak-ng `text` into a WAV at `path`, unless it is already there."""
    if shutil.which("espeak-ng") is None:
        raise InputError("espeak-ng is not installed (apt-get install espeak-ng)")
    if not path.exists():
        command = ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(path), text]
        subprocess.run(command, check=True, capture_output=True)
    return path


# Calibration speech for `asyncspec profile`: another public-domain text (Dickens, A Tale of Two
# Cities, 1859), so cost profiles never share audio with development or test windows.
TALE_OF_TWO_CITIES = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us."
)


def calibration_audio(directory: Path, words_per_minute: int = 150) -> Path:
    """One ~21 s espeak-ng utterance (en-gb), reused when already there."""
    directory.mkdir(parents=True, exist_ok=True)
    return speak(directory / "calibration-two-cities.wav", TALE_OF_TWO_CITIES, "en-gb", words_per_minute)
