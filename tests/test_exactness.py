"""A mismatch with target-only is a defect: the shared diagnosis (first divergent position, both
tokens, the target's logits for both), and every command that compares with target-only exiting 1
on a deliberately wrong method output, on tiny random models."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
import torch

from asyncspec.cli import main
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.exactness import ExactnessCheck, diagnose, first_divergence, logits_after
from conftest import synthetic_speech, tiny_causal, tiny_whisper

FLIP_AT = 2  # output position the wrong method changes
# A tiny random model's windows fail every quality check: without fallback each is one greedy decode.
NO_FALLBACK = ("--temperature-increment-on-fallback", "0")
WRONG_TOKEN = 60  # an ordinary token of both tiny vocabularies


def flip_one_token(method):
    """A method wrapper that returns its output with one token replaced: a deliberate mismatch."""

    def wrong(target, drafter, request, config):
        result = method(target, drafter, request, config)
        assert len(result.tokens) > FLIP_AT, "the tiny model stopped too early to be flipped"
        result.tokens[FLIP_AT] = WRONG_TOKEN if result.tokens[FLIP_AT] != WRONG_TOKEN else WRONG_TOKEN + 1
        return result

    return wrong


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # the method stopped early
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # the method went on


def test_diagnosis_names_both_tokens_with_the_targets_logits():
    target = tiny_causal(seed=3)
    request = target.request("w1 w2 w3", max_new_tokens=6)
    expected = decode_target_only(target, None, request).tokens
    got = list(expected)
    got[3] = (got[3] + 1) % (target.vocab_size - 1)
    mismatch = diagnose(target, request, expected, got, "prompt A", "sd")
    logits = logits_after(target, request, expected[:3])
    assert mismatch.position == 3
    assert (mismatch.target.id, mismatch.method_token.id) == (expected[3], got[3])
    assert mismatch.target.logit == float(logits[expected[3]]) == float(logits.max())  # greedy: the argmax
    assert mismatch.method_token.logit == float(logits[got[3]]) and mismatch.margin > 0
    assert mismatch.target.text == target.tokenizer.decode([expected[3]])
    line = mismatch.describe()
    assert "sd differs from target-only on prompt A at output token 3" in line
    assert f"{expected[3]} {mismatch.target.text!r}" in line and f"{got[3]} {mismatch.method_token.text!r}" in line


def test_an_output_that_stops_early_is_diagnosed_against_end_of_sequence():
    target = tiny_causal(seed=3)
    request = target.request("w1 w2", max_new_tokens=5)
    expected = decode_target_only(target, None, request).tokens
    mismatch = diagnose(target, request, expected, expected[:2], "prompt B", "specasr")
    assert mismatch.position == 2 and mismatch.method_token.ended and mismatch.method_token.id in target.eos_ids
    assert "end of output" in mismatch.describe()


def test_a_check_fails_on_a_mismatch_on_nothing_checked_and_on_an_unchecked_run(capsys):
    target = tiny_causal(seed=3)
    request = target.request("w1", max_new_tokens=4)
    passing = ExactnessCheck(target)
    assert passing.check("a", "sd", request, [1, 2], [1, 2])
    assert passing.report() == 0 and passing.passed
    assert ExactnessCheck(target).report() == 1  # nothing was checked
    assert "nothing was checked" in capsys.readouterr().err
    unchecked = ExactnessCheck(target)
    unchecked.check("a", "sd", request, [1, 2], [1, 2])
    unchecked.not_checked("sd under weak: 1 of 2 requests did not finish")
    assert unchecked.report() == 1 and "NOT CHECKED: sd under weak" in capsys.readouterr().err
    failing = ExactnessCheck(target)
    assert not failing.check("b", "sd", request, [1, 2], [1, 3])
    assert failing.report() == 1
    assert failing.as_json()["mismatches"][0]["position"] == 1


# ---------------------------------------------------------------- the commands, on tiny models


@pytest.fixture
def tiny_models(monkeypatch):
    """Every model name loads a tiny random model: Whisper-shaped for speech, Qwen-shaped for text
    (the drafter a different seed of the same shape)."""
    torch.manual_seed(0)
    whisper = {"whisper-base": tiny_whisper(seed=0), "whisper-tiny.en": tiny_whisper(seed=1)}
    for model in whisper.values():
        monkeypatch.setattr(model, "request", short_requests(model.request))
    causal = {"qwen2.5-coder-1.5b": tiny_causal(seed=0), "qwen2.5-coder-0.5b": tiny_causal(seed=1)}
    models = whisper | causal
    monkeypatch.setattr("asyncspec.models.registry.load_decoder", lambda name, dtype="bf16", **_: models[name])
    return models


TOKEN_CAP = 24  # a random model never says end-of-text: it would decode 440 tokens a window


def short_requests(request):
    def capped(*args, max_new_tokens=None, **kwargs):
        return request(*args, max_new_tokens=min(max_new_tokens or TOKEN_CAP, TOKEN_CAP), **kwargs)

    return capped


@pytest.fixture
def wrong_sd(monkeypatch):
    monkeypatch.setitem(METHODS, "sd", flip_one_token(METHODS["sd"]))


@pytest.fixture
def speech_file(tmp_path):
    path = tmp_path / "speech" / "speech.wav"
    path.parent.mkdir()
    soundfile.write(path, synthetic_speech(2.0, seed=4), 16_000)
    return path


def one_clip(monkeypatch, module: str, path) -> None:
    """The LibriVox workload reduced to one short clip (the command's own code path otherwise)."""
    clip = SimpleNamespace(path=path, transcript="a short synthetic clip")
    monkeypatch.setattr(f"asyncspec.{module}.librivox_clips", lambda: [clip])


def assert_reports_the_flip(err: str, where: str) -> None:
    line = next(line for line in err.splitlines() if line.startswith("MISMATCH"))
    assert f"sd differs from target-only on {where}" in line and f"at output token {FLIP_AT}" in line
    assert f"sd {WRONG_TOKEN} " in line and line.count("target logit") == 2
    assert "FAILED: 1 of 1 outputs differ from target-only" in err


def test_transcribe_compare_passes_when_equal(tiny_models, speech_file, capsys):
    assert main(["transcribe", str(speech_file), "--method", "sd", "--compare", *NO_FALLBACK]) == 0
    assert "all 1 outputs equal to target-only" in capsys.readouterr().err


def test_transcribe_compare_exits_1_on_a_mismatch(tiny_models, wrong_sd, speech_file, capsys):
    assert main(["transcribe", str(speech_file), "--method", "sd", "--compare", *NO_FALLBACK]) == 1
    captured = capsys.readouterr()
    assert_reports_the_flip(captured.err, f"{speech_file} window 0")
    assert "sd: 1 window(s) differing from target-only left out of its figures" in captured.out


def test_transcribe_without_compare_checks_nothing_and_claims_nothing(tiny_models, wrong_sd, speech_file):
    assert main(["transcribe", str(speech_file), "--method", "sd", *NO_FALLBACK]) == 0


def test_generate_compare_exits_1_on_a_mismatch(tiny_models, wrong_sd, capsys):
    argv = ["generate", "--prompt", "w1 w2 w3", "--method", "sd", "--compare", "--max-new-tokens", "8"]
    assert main(argv) == 1
    assert_reports_the_flip(capsys.readouterr().err, "the prompt")


def test_demo_exits_1_on_a_mismatch(tiny_models, wrong_sd, speech_file, tmp_path, monkeypatch, capsys):
    one_clip(monkeypatch, "commands.demo", speech_file)
    assert main(["demo", "--method", "sd", "--json", str(tmp_path / "demo.json")]) == 1
    assert_reports_the_flip(capsys.readouterr().err, f"{speech_file} window 0")
    report = json.loads((tmp_path / "demo.json").read_text())
    assert not report["exactness"]["passed"] and report["exactness"]["mismatches"][0]["position"] == FLIP_AT
    assert report["summary"]["sd"]["excluded"] == 1 and report["summary"]["sd"]["tokens"] == 0


def test_bench_methods_exits_1_on_a_mismatch(tiny_models, wrong_sd, speech_file, tmp_path, monkeypatch, capsys):
    one_clip(monkeypatch, "benchmarks.methods", speech_file)
    argv = ["bench", "methods", "--workload", "librivox", "--method", "sd", "--out", str(tmp_path)]
    assert main(argv) == 1
    assert_reports_the_flip(capsys.readouterr().err, f"{speech_file} window 0")
    report = json.loads((tmp_path / "methods_librivox.json").read_text())
    assert report["exactness"]["mismatches"][0]["method"] == "sd"
    assert report["summary"]["sd"]["excluded"] == 1 and report["summary"]["sd"]["tokens"] == 0


def test_bench_ondevice_exits_1_on_a_mismatch(tiny_models, wrong_sd, speech_file, tmp_path, capsys):
    argv = ["bench", "ondevice", "--audio", str(speech_file.parent), "--method", "sd", "--out", str(tmp_path)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    for budget in (5, 6, 7, 8):  # every budget's run is checked
        assert f"MISMATCH: sd (budget {budget}) differs from target-only on speech window speech.wav#0" in err
    report = json.loads((tmp_path / "bench_ondevice.json").read_text())
    sd = report["methods"]["sd"]
    assert sd["mismatched_windows"] == 1 and sd["equal_windows"] == 0 and sd["pooled_tps"] == 0
    assert len(report["exactness"]["mismatches"]) == 4


def ondemand_argv(tmp_path) -> list[str]:
    """Two requests (at 2 s and 4 s) over a 6 s recording."""
    recording = tmp_path / "long.wav"
    soundfile.write(recording, np.concatenate([synthetic_speech(2.0, seed=s) for s in range(3)]), 16_000)
    argv = ["bench", "ondemand", "--audio", str(recording), "--method", "sd", "--out", str(tmp_path)]
    return argv + ["--every", "2", "--until", "4", "--window-s", "2", "--block-s", "1"]


def test_bench_ondemand_passes_when_equal(tiny_models, tmp_path, capsys):
    assert main(ondemand_argv(tmp_path)) == 0
    assert "all 2 outputs equal to target-only" in capsys.readouterr().err
    report = json.loads((tmp_path / "bench_ondemand.json").read_text())
    assert report["methods"]["sd"]["mismatched_requests"] == 0 and report["methods"]["sd"]["tokens"] > 0


def test_bench_ondemand_exits_1_on_a_mismatch(tiny_models, wrong_sd, tmp_path, capsys):
    assert main(ondemand_argv(tmp_path)) == 1
    err = capsys.readouterr().err
    assert "MISMATCH: sd differs from target-only on the request at 2.00 s" in err
    assert "MISMATCH: sd differs from target-only on the request at 4.00 s" in err
    report = json.loads((tmp_path / "bench_ondemand.json").read_text())
    assert report["methods"]["sd"]["mismatched_requests"] == 2 and report["methods"]["sd"]["tokens"] == 0


@pytest.fixture
def wrong_as2d_without_producers(monkeypatch):
    """As²d replaced by target-only with one token flipped, and no producer processes to start: the
    commands' collection, checking and reporting run as they are."""
    from contextlib import contextmanager

    @contextmanager
    def no_workers(choices, producer_model, dtype, target):
        yield {choice.name: None for choice in choices}

    monkeypatch.setattr("asyncspec.profiling.collect.producers", no_workers)
    monkeypatch.setitem(METHODS, "as2d", flip_one_token(decode_target_only))


@pytest.fixture
def flat_profile(tmp_path):
    """A made-up cost profile: only the plumbing of the commands needs it."""
    from asyncspec.profiling.costs import IDLE, CostProfile

    path = tmp_path / "profile.json"
    CostProfile(
        "whisper-base", "bf16", {IDLE: {0: {k: [0.03 + 0.002 * k] for k in range(1, 26)}}}, 0.0002, 0.002, 0.0003, 2e-5
    ).save(path)
    return path


def test_replay_validate_exits_1_on_a_mismatch(
    tiny_models, wrong_as2d_without_producers, flat_profile, speech_file, tmp_path, capsys
):
    argv = ["replay", "--validate", "--audio", str(speech_file.parent), "--profile", str(flat_profile)]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    line = "MISMATCH: as2d (ct2-chunk@4s) differs from target-only on speech speech.wav#0 at output token 2"
    assert line in err and f"as2d (ct2-chunk@4s) {WRONG_TOKEN} " in err
    report = json.loads((tmp_path / "out" / "replay_validate.json").read_text())
    assert report["windows"] == 0 and report["exactness"]["mismatches"][0]["position"] == FLIP_AT


def test_select_budget_deploys_nothing_on_a_mismatch(
    tiny_models, wrong_as2d_without_producers, flat_profile, speech_file, tmp_path, capsys
):
    config = tmp_path / "as2d.json"
    argv = ["select-budget", "--audio", str(speech_file.parent), "--profile", str(flat_profile), "--max-budget", "3"]
    assert main([*argv, "--producers", "ct2-chunk@4s", "--config", str(config), "--out", str(tmp_path)]) == 1
    assert "MISMATCH: as2d (ct2-chunk@4s) differs from target-only" in capsys.readouterr().err
    assert not config.exists()
