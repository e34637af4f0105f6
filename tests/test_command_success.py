"""The success paths of `demo`, `select-budget` and `replay --validate` on the real models and one
real LibriVox clip: each exits 0, and what it writes is checked against what it must say (their
failure paths, exit 1 on a mismatch, are in test_exactness.py). The cost profile is a flat one made
up for the plumbing, so that no profile is measured here; the figures that depend on it are not
checked, the ones that do not (exactness, what was deployed, the pricer's own agreement with the
native durations) are."""

from __future__ import annotations

import json
import shutil

import pytest

from asyncspec.cli import main
from asyncspec.data.librivox import librivox_clips
from asyncspec.profiling.costs import IDLE, CostProfile

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def clip():
    return librivox_clips()[0]


@pytest.fixture
def audio_dir(clip, tmp_path):
    directory = tmp_path / "audio"
    directory.mkdir()
    shutil.copy(clip.path, directory / clip.path.name)
    return directory


@pytest.fixture
def flat_profile(tmp_path):
    path = tmp_path / "profile.json"
    costs = {IDLE: {0: {k: [0.03 + 0.002 * k] for k in range(1, 26)}}}
    CostProfile("whisper-base", "bf16", costs, 0.0002, 0.002, 0.0003, 2e-5).save(path)
    return path


def test_demo_exits_0_with_every_method_equal_and_scored(clip, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("asyncspec.commands.demo.librivox_clips", lambda: [clip])
    assert main(["demo", "--json", str(tmp_path / "demo.json")]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "demo.json").read_text())
    assert report["exactness"]["passed"] and report["exactness"]["mismatches"] == []
    assert report["as2d"] == {"producer": "ct2-chunk@4s", "chunk_s": 4.0, "budget": 7, "source": "built-in default"}
    summary = report["summary"]
    assert {"target", "sd", "specasr", "as2d"} <= set(summary)
    tokens = {method: row["tokens"] for method, row in summary.items()}
    assert len(set(tokens.values())) == 1 and tokens["target"] > 10, tokens  # the same output, all counted
    assert all(row["excluded"] == 0 for row in summary.values())
    wer_lines = [line for line in out.splitlines() if "WER" in line and "LibriVox" in line]
    assert len(wer_lines) == len(summary)
    assert len({line.split("WER ")[1].split("%")[0] for line in wer_lines}) == 1  # equal outputs, equal WER


def test_select_budget_exits_0_and_deploys_what_it_selected(audio_dir, flat_profile, tmp_path, capsys):
    config = tmp_path / "as2d.json"
    # up to the default's budget: the default is a candidate, so nothing can be refused
    argv = ["select-budget", "--audio", str(audio_dir), "--profile", str(flat_profile), "--max-budget", "7"]
    assert main([*argv, "--producers", "ct2-chunk@4s", "--config", str(config), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "the built-in default ct2-chunk@4s budget 7" in printed
    deployed = json.loads(config.read_text())
    report = json.loads((tmp_path / "select_budget.json").read_text())
    selected, default = report["selected"], report["built_in_default"]
    assert selected["producer"] == "ct2-chunk@4s" and 1 <= selected["budget"] <= 7
    assert (deployed["producer"], deployed["budget"]) == (selected["producer"], selected["budget"])
    assert selected["pooled_tps"] >= default["pooled_tps"] == deployed["default_pooled_tps"]
    assert report["deployed"] == str(config) and report["refused"] is None
    assert (tmp_path / "select_budget_trajectories.json").is_file()
    # collected twice by default, each entry charged its slower replay: both collections are kept
    assert len(report["collections"]) == 2 and (tmp_path / "select_budget_trajectories_2.json").is_file()
    assert "per collection: the selection" in printed


def test_replay_validate_exits_0_and_its_pricer_reproduces_native_durations(audio_dir, flat_profile, tmp_path):
    out = tmp_path / "out"
    argv = ["replay", "--validate", "--audio", str(audio_dir), "--profile", str(flat_profile), "--budget", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads((out / "replay_validate.json").read_text())
    assert report["exactness"]["passed"] and report["windows"] == 1
    assert report["runs"] == 3 and report["per_window"][0]["runs"] == 3  # medians of three runs by default
    assert report["native_run_to_run_pct"] >= 0 and report["target_run_to_run_pct"] >= 0
    # replay priced with the run's own measured durations must give back the run's own time
    assert report["native_pricer_max_abs_error_s"] < 1e-6
    assert (out / "replay_validate_trajectories.json").is_file()
