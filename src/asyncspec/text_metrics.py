"""Transcript normalisation, word error rate and word recall.

Both texts go through Whisper's English normaliser (the one openai-whisper and the Whisper paper
score with), so that spelling variants (harbour / harbor), numbers (ten / 10), punctuation, casing
and fillers (um, hmm) are not counted as errors. The class is transformers' copy of it
(`transformers.models.whisper.english_normalizer`, already a dependency); its British-to-American
spelling map (english.json) is not shipped by transformers, so it is read from the
`whisper-normalizer` package (PyPI, MIT; its english.json is byte for byte openai-whisper's,
SHA-256 below). Without that package (it is in the `bench` extra) the normaliser runs with no
spelling map, and `spelling_map_source()` says so, for the benchmarks to record.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources

# openai-whisper 20250625's whisper/normalizers/english.json, as whisper-normalizer 0.1.15 ships it.
SPELLING_MAP_SHA256 = "6607f948be9824d2e1b2fa2223cd94c06c45afa4e05ea0e3d5e1f2bdffde2465"
SPELLING_MAP_PACKAGE = "whisper_normalizer"
SPELLING_MAP_HINT = "pip install whisper-normalizer==0.1.15  (or: pip install 'asyncspec[bench]')"


@lru_cache(maxsize=1)
def _spelling_map() -> tuple[dict[str, str], str]:
    """(map, where it came from); an empty map when the package is absent or its file changed."""
    if importlib.util.find_spec(SPELLING_MAP_PACKAGE) is None:
        return {}, f"none ({SPELLING_MAP_PACKAGE} not installed: {SPELLING_MAP_HINT})"
    data = resources.files(SPELLING_MAP_PACKAGE).joinpath("normalizers/english.json").read_bytes()
    if hashlib.sha256(data).hexdigest() != SPELLING_MAP_SHA256:
        # A different map would silently change every WER; better none, and said so.
        return {}, f"none ({SPELLING_MAP_PACKAGE}'s english.json is not openai-whisper's)"
    return json.loads(data), f"{SPELLING_MAP_PACKAGE} english.json sha256:{SPELLING_MAP_SHA256[:12]}"


def spelling_map_source() -> str:
    """Which British-to-American spelling map the normaliser uses (for benchmark records)."""
    return _spelling_map()[1]


@lru_cache(maxsize=1)
def _normalizer() -> Callable[[str], str]:
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer(_spelling_map()[0])


@lru_cache(maxsize=1)
def _basic_normalizer() -> Callable[[str], str]:
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer

    return BasicTextNormalizer()


def normalize(text: str, language: str = "en") -> list[str]:
    """Whisper's English normalisation, as words; for other languages its basic one (lower case,
    no punctuation or bracketed text), as openai-whisper scores its multilingual sets."""
    return (_normalizer() if language == "en" else _basic_normalizer())(text).split()


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    previous = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, 1):
        current = [i]
        for j, hyp_word in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word)))
        previous = current
    return previous[-1]


def errors_at_reference_words(reference: Sequence[str], hypothesis: Sequence[str]) -> list[int]:
    """Per reference word, the word edits one minimal alignment places there: a substitution or
    deletion at its word, an insertion at the reference word that follows it (at the last word when
    it follows them all). Summed, they are `edit_distance` (for a non-empty reference), and any
    stretch of the reference can be given its own errors: the unit of a paired WER comparison."""
    if not reference:
        return []
    table = [list(range(len(hypothesis) + 1))]
    for i, ref_word in enumerate(reference, 1):
        row = [i]
        for j, hyp_word in enumerate(hypothesis, 1):
            row.append(min(table[-1][j] + 1, row[j - 1] + 1, table[-1][j - 1] + (ref_word != hyp_word)))
        table.append(row)
    errors = [0] * len(reference)
    i, j = len(reference), len(hypothesis)
    while i or j:
        if i and j and table[i][j] == table[i - 1][j - 1] + (reference[i - 1] != hypothesis[j - 1]):
            errors[i - 1] += reference[i - 1] != hypothesis[j - 1]
            i, j = i - 1, j - 1
        elif i and table[i][j] == table[i - 1][j] + 1:
            errors[i - 1] += 1  # deleted
            i -= 1
        else:
            errors[min(i, len(reference) - 1)] += 1  # inserted before reference word i
            j -= 1
    return errors


def common_subsequence(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Length of the longest common subsequence: the reference words found in order."""
    previous = [0] * (len(hypothesis) + 1)
    for ref_word in reference:
        current = [0]
        for j, hyp_word in enumerate(hypothesis, 1):
            current.append(previous[j - 1] + 1 if ref_word == hyp_word else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def word_errors(reference: str, hypothesis: str, language: str = "en") -> tuple[int, int]:
    """(word edits, reference words) after normalisation; sum both over a corpus for its WER."""
    ref, hyp = normalize(reference, language), normalize(hypothesis, language)
    return edit_distance(ref, hyp), len(ref)


def recalled_words(reference: str, hypothesis: str) -> tuple[int, int]:
    """(reference words present in the hypothesis in order, reference words); sum over a corpus."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    return common_subsequence(ref, hyp), len(ref)


def word_recall(reference: str, hypothesis: str) -> float:
    """The share of normalised reference words present in the hypothesis in order. Unlike WER it
    ignores insertions, so it isolates dropped speech: a window that stops early loses recall."""
    found, words = recalled_words(reference, hypothesis)
    return found / words if words else 1.0
