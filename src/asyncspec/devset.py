"""A synthetic development set: public-domain prose spoken by espeak-ng, disjoint from the
LibriVox test clips (Austen's Pride and Prejudice, 1813, not Sense and Sensibility)."""

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
VOICES = ("en-us", "en-gb")


def synthesize_dev_set(directory: Path, words_per_minute: int = 160) -> list[Path]:
    """One WAV per (voice, pair of passages), ~8-20 s each; reused when already there."""
    if shutil.which("espeak-ng") is None:
        raise InputError("espeak-ng is not installed (apt-get install espeak-ng)")
    directory.mkdir(parents=True, exist_ok=True)
    texts = [" ".join(PRIDE_AND_PREJUDICE[i : i + 2]) for i in range(0, len(PRIDE_AND_PREJUDICE), 2)]
    paths = []
    for voice in VOICES:
        for index, text in enumerate(texts):
            path = directory / f"pride-{voice}-{index}.wav"
            if not path.exists():
                command = ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(path), text]
                subprocess.run(command, check=True, capture_output=True)
            paths.append(path)
    return paths
