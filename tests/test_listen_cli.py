"""`asyncspec listen` and `asyncspec bench ondemand`: bad arguments and bad input end with exit
code 2 and one clear line, before any model is loaded."""

from __future__ import annotations

import pytest

from asyncspec.cli import EXIT_BAD_INPUT, main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["listen", "--audio", "NOTES"], "not a readable audio file"),
        (["listen", "--audio", "missing.wav"], "no such file"),
        (["listen", "--stdin", "--block-s", "0"], "--block-s must be positive"),
        (["listen", "--audio", "CLIP", "--max-queue", "0"], "--max-queue"),
        (["listen", "--audio", "CLIP", "--auto", "--reset-s", "2"], "--reset-s"),
        (["listen", "--audio", "CLIP", "--method", "nope"], "unknown method"),
        (["listen", "--audio", "CLIP", "--header-timeout", "0"], "timeouts must be positive"),
        (["bench", "ondemand", "--every", "0"], "--every must be positive"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, capsys, argv, message):
    from asyncspec.data.librivox import librivox_clips

    notes = tmp_path / "notes.txt"
    notes.write_text("not audio")
    substitutes = {"NOTES": str(notes), "CLIP": str(librivox_clips()[1].path)}
    argv = [substitutes.get(a, a) for a in argv]
    assert main(argv) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_listen_needs_one_input(capsys):
    with pytest.raises(SystemExit):
        main(["listen"])
    assert "--audio" in capsys.readouterr().err
