import pytest

from asyncspec.text_metrics import (
    common_subsequence,
    edit_distance,
    normalize,
    recalled_words,
    spelling_map_source,
    word_errors,
    word_recall,
)


def test_normalize_spells_out_and_strips_punctuation():
    assert normalize(" And Mr. John Dashwood, ill-disposed!") == [
        "and",
        "mister",
        "john",
        "dashwood",
        "ill",
        "disposed",
    ]


def test_word_errors_count_substitutions_insertions_deletions():
    assert edit_distance("a b c d".split(), "a x c".split()) == 2
    assert word_errors("had he married a more a amiable woman", "Had he married a more amiable woman?") == (1, 8)
    assert word_errors("red green", "") == (2, 2)


def test_the_whisper_normaliser_forgives_spelling_numbers_and_fillers():
    # British spelling needs the spelling map (whisper-normalizer, in the bench extra).
    if spelling_map_source().startswith("none"):
        pytest.skip(spelling_map_source())
    assert word_errors("The harbour colour, in the neighbourhood.", "the harbor color in the neighborhood") == (0, 6)
    assert word_errors("ten of clubs", "10 of Clubs.") == (0, 3)
    assert word_errors("It was the best of times.", "Um, it was the best of times, hmm.") == (0, 6)


def test_common_subsequence_counts_words_in_order():
    assert common_subsequence("a b c d e f".split(), "a c x e".split()) == 3
    assert common_subsequence("a b c".split(), "c b a".split()) == 1  # order matters
    assert common_subsequence("a b".split(), []) == 0


def test_word_recall_ignores_insertions_and_substitutes_nothing():
    reference = "it was the best of times it was the worst of times"
    assert word_recall(reference, reference.upper() + ".") == 1.0
    # Inserted words cost WER but no recall: they are not dropped speech.
    assert word_recall(reference, "oh " + reference + " indeed") == 1.0
    # One substitution (best -> beast) loses one of twelve words.
    assert word_recall(reference, reference.replace("best", "beast")) == pytest.approx(11 / 12)
    assert word_recall("", "anything") == 1.0


def test_word_recall_negative_control_a_third_of_the_words_missing():
    reference = "the quick brown fox jumps over a lazy dog by the old green river bank"
    words = reference.split()  # 15 words; drop every third one, scattered
    hypothesis = " ".join(word for index, word in enumerate(words) if index % 3 != 2)
    assert recalled_words(reference, hypothesis) == (10, 15)
    assert round(word_recall(reference, hypothesis), 2) == 0.67
    # A whole third dropped as one block, as a window that ends after its first sentence does.
    reference = "he was not an ill disposed young man unless to be rather cold and selfish"
    kept = reference.split()[:10]
    assert word_recall(reference, " ".join(kept)) == pytest.approx(10 / 15)
    assert round(word_recall(reference, " ".join(kept)), 2) == 0.67
