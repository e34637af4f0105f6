"""Languages and tasks: Whisper's language identification, the translate task, and As²d falling back
to target-only, with a note, where its English-only producer cannot draft the speech. Tiny models
here; the real Whisper base in test_longform_real.py."""

from __future__ import annotations

import types

import pytest
import torch

from asyncspec.errors import InputError
from asyncspec.transcription.api import Transcriber
from conftest import synthetic_speech, tiny_whisper


@pytest.fixture(scope="module")
def multilingual():
    return tiny_whisper(torch.float32, seed=21, multilingual=True)


def test_the_language_tokens_are_read_from_the_tokenizer(multilingual):
    languages = multilingual.languages
    token = multilingual.tokenizer.token_id
    assert languages["en"] == token("<|en|>") and languages["fr"] == token("<|fr|>")
    assert len(languages) >= 99 and "translate" not in languages and "startoftranscript" not in languages


def test_detection_is_a_distribution_over_the_languages(multilingual):
    encoded = multilingual.encode_audio(synthetic_speech(2.0, seed=21))
    code, probability, everything = multilingual.detect_language(encoded)
    assert set(everything) == set(multilingual.languages) and abs(sum(everything.values()) - 1) < 1e-9
    assert everything[code] == probability == max(everything.values())
    assert multilingual.detect_language(encoded)[2] == everything  # a function of the audio alone


def test_the_task_is_in_the_prompt_and_english_only_models_refuse_other_languages(multilingual):
    token = multilingual.tokenizer.token_id
    translate = multilingual.prompt_ids("de", timestamps=True, task="translate")
    assert translate == (token("<|startoftranscript|>"), token("<|de|>"), token("<|translate|>"))
    with pytest.raises(InputError, match="task must be one of"):
        multilingual.prompt_ids("de", task="summarise")
    with pytest.raises(InputError, match="no language 'xx'"):
        multilingual.prompt_ids("xx")
    english = tiny_whisper(torch.float32, seed=21)
    with pytest.raises(InputError, match="English-only: it cannot translate"):
        english.prompt_ids("en", task="translate")
    with pytest.raises(InputError, match="English-only, not 'fr'"):
        english.prompt_ids("fr")


def test_as2d_with_an_english_only_producer_decodes_other_languages_target_only_and_says_so(multilingual):
    transcriber = Transcriber.from_loaded(multilingual, {"as2d": object()}, "tiny", producer_model="whisper-tiny.en")
    audio, quick = synthetic_speech(2.0, seed=22), {"temperatures": (0.0,)}
    for options in ({"language": "fr"}, {"language": "en", "task": "translate"}):
        _, info = transcriber.transcribe(audio, method="as2d", **options, **quick)
        assert info.method == "target" and len(info.notes) == 1 and "whisper-tiny.en" in info.notes[0]
    _, detected = transcriber.transcribe(audio, method="target", **quick)  # a multilingual model detects
    assert detected.options.language == detected.language and 0 < detected.language_probability <= 1
    alone = transcriber.detect_language(audio)  # the same identification, without transcribing
    assert alone[:2] == (detected.language, detected.language_probability)
    assert alone == multilingual.detect_language(multilingual.encode_audio(audio))
    assert transcriber.default_language is None


def test_hotwords_and_previous_text_are_laid_out_as_faster_whispers_prompt(multilingual):
    """Against faster-whisper's own get_prompt (the independent reference) on the real base tokenizer."""
    import tokenizers
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import WhisperModel

    from conftest import real_model_dir

    vocabulary = tokenizers.Tokenizer.from_file(str(real_model_dir("whisper-base") / "tokenizer.json"))
    hotwords = multilingual.tokenizer.encode(" Dashwood Norland")
    previous = multilingual.tokenizer.encode(" The family of Dashwood had long been settled in Sussex.")
    model = types.SimpleNamespace(max_length=multilingual.max_length)
    for language, task in (("en", "transcribe"), ("de", "translate")):
        reference = Tokenizer(vocabulary, True, task=task, language=language)
        for prev in ((), previous):
            expected = WhisperModel.get_prompt(model, reference, list(prev), hotwords="Dashwood Norland")
            assert multilingual.prompt_ids(language, True, prev, task, hotwords) == tuple(expected)
    keep = multilingual.max_length // 2 - 1  # the conditioning never takes more than that
    long_prompt = multilingual.prompt_ids("en", True, list(range(300)), hotwords=list(range(1000, 1100)))
    assert long_prompt[1:101] == tuple(range(1000, 1100)) and long_prompt[101 : keep + 1] == tuple(range(177, 300))
    assert len(multilingual.prompt_ids("en", True, list(range(300)), hotwords=list(range(500)))) == keep + 4
