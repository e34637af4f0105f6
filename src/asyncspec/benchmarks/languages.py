"""The multilingual set scored (data/multilingual.py): language identification against the spoken
language, transcription WER in that language (Whisper's basic normaliser), and translation into
English, WER (Whisper's English normaliser) and BLEU (sacrebleu's corpus BLEU, its defaults)
against the English originals. One row per clip and system: what the system said, in `outputs`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asyncspec.data.multilingual import Clip
from asyncspec.text_metrics import word_errors


@dataclass(frozen=True)
class ClipOutput:
    detected: str
    probability: float
    transcript: str
    translation: str


def _wer(pairs: Sequence[tuple[str, str]], language: str) -> float:
    edits = words = 0
    for reference, hypothesis in pairs:
        e, n = word_errors(reference, hypothesis, language)
        edits, words = edits + e, words + n
    return edits / words if words else 0.0


def bleu(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """sacrebleu's corpus BLEU (13a tokenisation, its defaults), on the raw texts as sacrebleu expects."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def _translation(pairs: Sequence[tuple[str, str]]) -> dict:
    """WER and BLEU of (English original, translation) pairs."""
    return {
        "translation_wer": round(_wer(pairs, "en"), 4),
        "translation_bleu": round(bleu([e for e, _ in pairs], [t for _, t in pairs]), 2),
    }


def _language_row(clips: Sequence[Clip], outputs: Sequence[ClipOutput]) -> dict:
    language = clips[0].language
    row = {
        "clips": len(clips),
        "detected_right": sum(o.detected == language for o in outputs),
        "detected_as": sorted({o.detected for o in outputs}),
        "transcription_wer": round(
            _wer([(c.text, o.transcript) for c, o in zip(clips, outputs, strict=True)], language), 4
        ),
    }
    if language != "en":
        row |= _translation([(c.english, o.translation) for c, o in zip(clips, outputs, strict=True)])
    return row


def score(clips: Sequence[Clip], outputs: Sequence[ClipOutput]) -> dict:
    """Per-language rows and the set's totals: identification accuracy over every clip, translation
    WER and BLEU over every non-English clip."""
    by_language: dict[str, list[int]] = {}
    for index, clip in enumerate(clips):
        by_language.setdefault(clip.language, []).append(index)
    languages = {
        language: _language_row([clips[i] for i in indices], [outputs[i] for i in indices])
        for language, indices in by_language.items()
    }
    foreign = [i for i, clip in enumerate(clips) if clip.language != "en"]
    return {
        "languages": languages,
        "identification_accuracy": round(
            sum(o.detected == c.language for c, o in zip(clips, outputs, strict=True)) / len(clips), 4
        ),
    } | _translation([(clips[i].english, outputs[i].translation) for i in foreign])
