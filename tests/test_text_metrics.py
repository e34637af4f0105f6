from asyncspec.text_metrics import edit_distance, normalize, word_errors


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
    assert word_errors("one two", "") == (2, 2)
