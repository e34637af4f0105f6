"""The deployed As²d configuration made visible (issue #29 §2-3): every command that uses one says
so on stderr and in its JSON, one made on another CPU (or by an older asyncspec, which did not say
where) is ignored with a note, `config show|reset` through the real command line, and
select-budget's refusal to deploy a configuration slower than the built-in default."""

from __future__ import annotations

import json

import pytest

from asyncspec.cli import EXIT_BAD_INPUT, build_parser, main
from asyncspec.commands.select_budget import DEFAULT_ENTRY, deploy
from asyncspec.errors import InputError
from asyncspec.models.machine import cpu_fingerprint, cpu_model
from asyncspec.profiling import deployed as deployed_module
from asyncspec.profiling.deployed import BUILT_IN, DeployedConfig, deployed_as2d, save_deployed
from asyncspec.profiling.selection import Entry, Selection
from asyncspec.run.options import DecodingOptions

SELECTED = DeployedConfig("ct2-chunk@6s", "whisper-tiny.en", 9, 30.0, default_pooled_tps=25.0)


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    path = tmp_path / "as2d.json"
    monkeypatch.setenv(deployed_module.CONFIG_ENV, str(path))
    return path


def rewrite(path, **fields) -> None:
    """The saved file with some fields replaced (None: removed), as another machine or an older
    asyncspec would have written it."""
    document = json.loads(path.read_text())
    for name, value in fields.items():
        if value is None:
            document.pop(name)
        else:
            document[name] = value
    path.write_text(json.dumps(document))


def settings():
    return deployed_as2d(None, None, None)


def test_saving_records_when_and_on_which_cpu(config_file):
    save_deployed(SELECTED)
    document = json.loads(config_file.read_text())
    assert document["machine"] == cpu_fingerprint() and document["cpu"] == cpu_model()
    assert document["made_at"].endswith("+00:00")  # UTC
    assert document["default_pooled_tps"] == 25.0


def test_a_configuration_made_here_is_used_and_announced(config_file):
    save_deployed(SELECTED)
    used = settings()
    assert (used.chunk_s, used.budget, used.source) == (6.0, 9, f"deployed {config_file}")
    note = used.note()
    assert note is not None and len(note.splitlines()) == 1
    assert str(config_file) in note and "ct2-chunk@6s budget 9" in note and cpu_model() in note
    assert json.loads(config_file.read_text())["made_at"] in note


@pytest.mark.parametrize(
    "foreign, reason",
    [
        ({"machine": "0" * 16, "cpu": "Elsewhere CPU 9000"}, "made on another CPU (Elsewhere CPU 9000"),
        ({"machine": "0" * 16}, "other instruction-set flags"),  # the same model name, other flags
        ({"machine": None, "cpu": None, "made_at": None}, "older asyncspec"),
    ],
)
def test_a_configuration_from_another_cpu_or_an_older_version_is_ignored_with_a_note(config_file, foreign, reason):
    save_deployed(SELECTED)
    rewrite(config_file, **foreign)
    ignored = settings()
    assert (ignored.producer, ignored.chunk_s, ignored.budget, ignored.source) == ("ct2-chunk", 4.0, None, BUILT_IN)
    note = ignored.note()
    assert note is not None and len(note.splitlines()) == 1
    assert reason in note and str(config_file) in note
    assert "asyncspec select-budget" in note and "asyncspec config reset" in note


def test_options_given_on_the_command_line_are_recorded_as_such(config_file):
    save_deployed(SELECTED)
    assert deployed_as2d("ct2-chunk", 2.0, 3).source == "command line"
    mixed = deployed_as2d(None, None, 3)
    assert (mixed.chunk_s, mixed.budget) == (6.0, 3)
    assert mixed.source == f"deployed {config_file} + command line"


def test_the_json_record_says_which_configuration_ran_and_from_where(config_file):
    def record(*argv):
        arguments = build_parser().parse_args(["transcribe", "a.wav", "--method", "as2d", *argv])
        return DecodingOptions.from_args(arguments).as2d_record()

    assert record() == {"producer": "ct2-chunk@4s", "chunk_s": 4.0, "budget": 7, "source": BUILT_IN}
    save_deployed(SELECTED)
    deployed = record()
    assert deployed["producer"] == "ct2-chunk@6s" and deployed["budget"] == 9
    assert deployed["source"] == f"deployed {config_file}" and deployed["cpu"] == cpu_model()
    assert deployed["made_at"] == json.loads(config_file.read_text())["made_at"]
    assert record("--method", "target") is None  # As²d does not run: nothing to record
    rewrite(config_file, machine="0" * 16)
    ignored = record()
    assert ignored["source"] == BUILT_IN and "other instruction-set flags" in ignored["ignored"]


def write_notes(tmp_path):
    (tmp_path / "notes.txt").write_text("not audio at all\n" * 10)
    return str(tmp_path / "notes.txt")


def test_transcribe_says_on_stderr_which_deployed_configuration_it_uses(config_file, tmp_path, capsys):
    # the configuration is resolved (and announced) before any file is read: a bad file ends the run cheaply
    save_deployed(SELECTED)
    assert main(["transcribe", write_notes(tmp_path), "--method", "as2d"]) == EXIT_BAD_INPUT
    note, error = capsys.readouterr().err.strip().splitlines()
    assert note.startswith("asyncspec: As²d uses the deployed configuration") and str(config_file) in note
    assert error.startswith("asyncspec: error:")
    # the control: target-only uses no deployed configuration and says nothing about one
    assert main(["transcribe", write_notes(tmp_path), "--method", "target"]) == EXIT_BAD_INPUT
    assert "deployed" not in capsys.readouterr().err


def test_transcribe_says_why_it_ignores_a_foreign_configuration(config_file, tmp_path, capsys):
    save_deployed(SELECTED)
    rewrite(config_file, machine="0" * 16, cpu="Elsewhere CPU 9000")
    assert main(["transcribe", write_notes(tmp_path), "--method", "as2d"]) == EXIT_BAD_INPUT
    note = capsys.readouterr().err.splitlines()[0]
    assert note.startswith("asyncspec: note: ignoring the deployed configuration") and "another CPU" in note


def test_demo_says_on_stderr_which_deployed_configuration_it_uses(config_file, monkeypatch, capsys):
    def stop():  # no clip is decoded: the announcement comes first
        raise InputError("stopped before the clips")

    monkeypatch.setattr("asyncspec.commands.demo.librivox_clips", stop)
    save_deployed(SELECTED)
    assert main(["demo"]) == EXIT_BAD_INPUT
    note, error = capsys.readouterr().err.strip().splitlines()
    assert "As²d uses the deployed configuration" in note and "ct2-chunk@6s budget 9" in note
    assert error == "asyncspec: error: stopped before the clips"


def test_config_show_and_reset_through_the_command_line(config_file, tmp_path, capsys):
    assert main(["config", "show"]) == 0
    assert "no deployed As²d configuration" in capsys.readouterr().out
    save_deployed(SELECTED)
    assert main(["config", "show", "--json", str(tmp_path / "show.json")]) == 0
    shown = capsys.readouterr().out
    for expected in (str(config_file), "ct2-chunk@6s", "budget 9", cpu_model(), "applies to this machine: yes"):
        assert expected in shown
    assert "built-in default: ct2-chunk@4s budget 7" in shown and "25.00 tok/s" in shown
    report = json.loads((tmp_path / "show.json").read_text())
    assert report["deployed"]["applies"] is True and report["built_in_default"] == {
        "producer": "ct2-chunk@4s",
        "budget": 7,
    }
    assert main(["config", "reset"]) == 0
    assert f"removed the deployed As²d configuration {config_file}" in capsys.readouterr().out
    assert not config_file.exists()
    assert main(["config", "show"]) == 0
    assert "no deployed As²d configuration" in capsys.readouterr().out
    assert settings().source == BUILT_IN and settings().budget is None  # the defaults are back
    assert main(["config", "reset"]) == 0
    assert "nothing removed" in capsys.readouterr().out


def test_config_show_says_a_foreign_configuration_does_not_apply(config_file, capsys):
    save_deployed(SELECTED)
    rewrite(config_file, machine=None, cpu=None, made_at=None)
    assert main(["config", "show"]) == 0
    shown = capsys.readouterr().out
    assert "applies to this machine: no" in shown and "older asyncspec" in shown


def test_a_damaged_file_is_a_clear_error_that_names_reset(config_file, capsys):
    config_file.write_text("{not json")
    assert main(["config", "show"]) == EXIT_BAD_INPUT
    assert "asyncspec config reset" in capsys.readouterr().err
    assert main(["config", "reset"]) == 0 and not config_file.exists()


def test_select_budget_deploys_only_what_is_not_slower_than_the_default(tmp_path):
    path = tmp_path / "as2d.json"
    slower = Selection(Entry("autoregressive", 3), 20.0, DEFAULT_ENTRY, 25.0)
    assert deploy(slower, SELECTED, path) is None and not path.exists()
    assert "20.00 tok/s" in slower.refusal and "25.00 tok/s" in slower.refusal
    faster = Selection(Entry("ct2-chunk@6s", 9), 30.0, DEFAULT_ENTRY, 25.0)
    assert deploy(faster, SELECTED, path) == path and json.loads(path.read_text())["budget"] == 9


def test_the_default_is_what_every_command_runs_without_a_deployed_configuration(config_file):
    """select-budget's comparison is against what runs when nothing is deployed."""
    default = settings()
    assert DEFAULT_ENTRY == Entry(f"{default.producer}@{default.chunk_s:g}s", DEFAULT_ENTRY.budget)
    assert DecodingOptions.from_args(
        build_parser().parse_args(["transcribe", "a.wav", "--method", "as2d"])
    ).as2d_record()["budget"] == (DEFAULT_ENTRY.budget)


AUTOREGRESSIVE = DeployedConfig("autoregressive", "whisper-tiny.en", 7, 136.1, default_pooled_tps=86.6)


def test_long_form_transcription_ignores_a_deployed_producer_that_cannot_draft_it(config_file, tmp_path, capsys):
    """select-budget ranks producers on short windows, and on a Zen 2 EPYC deployed the
    autoregressive one, whose drafts carry no audio time: `transcribe` then failed on every file."""
    save_deployed(AUTOREGRESSIVE)
    longform = deployed_as2d(None, None, None, required="ct2-chunk")
    assert (longform.producer, longform.chunk_s, longform.budget, longform.source) == ("ct2-chunk", 4.0, None, BUILT_IN)
    note = longform.note()
    assert note is not None and "ignoring" in note and "autoregressive" in note and "--producers ct2-chunk" in note
    missing = str(tmp_path / "missing.wav")
    assert main(["transcribe", missing, "--method", "as2d"]) == EXIT_BAD_INPUT  # the missing file, not the producer
    err = capsys.readouterr().err
    assert "missing.wav: no such file" in err and "error: long-form" not in err
    assert (
        main(["transcribe", missing, "--method", "as2d", "--producer", "autoregressive"]) == EXIT_BAD_INPUT
    )  # asked for: refused
    assert "drafts with the ct2-chunk producer" in capsys.readouterr().err
    # controls: a command that drafts with either kind uses it, with its budget; and a deployed
    # chunked producer is what long-form transcription uses
    assert (settings().producer, settings().budget) == ("autoregressive", 7)
    save_deployed(SELECTED)
    assert deployed_as2d(None, None, None, required="ct2-chunk").budget == 9
