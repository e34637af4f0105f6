"""`--method auto` (the default): As²d only where its producer leaves the target two cores, target-only
elsewhere, and always a line that says which and why; the beam search and English-only drafter rules
that send a window to target-only with a note."""

from __future__ import annotations

from asyncspec.transcription.longform import LongformOptions
from asyncspec.transcription.method_choice import MIN_AS2D_CORES, resolve_auto, runnable


def test_auto_is_target_only_on_two_cores_and_says_why():
    methods, note = resolve_auto(("auto",), cores=2)
    assert methods == ("target",)
    assert note is not None and note.startswith("method auto: target-only") and "--method as2d" in note


def test_auto_is_as2d_where_the_producer_leaves_the_target_two_cores():
    # the control of the rule above: one more core and the same call chooses As²d
    methods, note = resolve_auto(("auto",), cores=MIN_AS2D_CORES)
    assert methods == ("as2d",) and note is not None and "As²d" in note
    assert resolve_auto(("auto",), cores=MIN_AS2D_CORES - 1)[0] == ("target",)


def test_named_methods_are_kept_and_repeats_dropped():
    assert resolve_auto(("as2d", "target"), cores=2) == (("as2d", "target"), None)
    assert resolve_auto(("auto", "target"), cores=2)[0] == ("target",)
    assert resolve_auto(("target", "auto"), cores=8)[0] == ("target", "as2d")


def test_a_beam_search_runs_target_only_with_a_note_and_greedy_keeps_the_method():
    beams = LongformOptions(beam_size=5)
    assert runnable("as2d", beams, "whisper-tiny.en", "whisper-tiny.en")[0] == "target"
    assert "beam search of 5" in runnable("sd", beams, "whisper-tiny.en", "whisper-tiny.en")[1][0]
    assert runnable("as2d", LongformOptions(), "whisper-tiny.en", "whisper-tiny.en") == ("as2d", [])
    german = LongformOptions(language="de")
    assert runnable("as2d", german, "whisper-tiny.en", "whisper-tiny.en")[0] == "target"
    assert runnable("target", beams, "whisper-tiny.en", "whisper-tiny.en") == ("target", [])


def test_compare_makes_auto_as2d_on_any_machine():
    """Target-only compared with itself checks nothing (and `--compare` fails a run that checked
    nothing), so with --compare auto is the method it can check."""
    methods, note = resolve_auto(("auto",), cores=2, compare=True)
    assert methods == ("as2d",) and note is not None and "--compare" in note
