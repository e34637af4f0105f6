"""The command line on real models and recordings, and its errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asyncspec.cli import EXIT_BAD_INPUT, main
from asyncspec.data.librivox import librivox_clips
from asyncspec.profiling.costs import CONCURRENT, IDLE, CostProfile
from asyncspec.text_metrics import word_errors
from asyncspec.transcription.method_choice import resolve_auto

REQUIRED_FIELDS = {"file", "window", "method", "text", "token_ids", "n_tokens", "decode_s", "tps", "target_calls"}


@pytest.mark.real
def test_transcribe_runs_the_auto_method_by_default_and_writes_subtitles(tmp_path, capsys):
    import srt
    import webvtt

    clips = librivox_clips()
    assert len(clips) == 5
    out = tmp_path / "out"
    argv = ["transcribe", *[str(c.path) for c in clips], "--json", str(tmp_path / "t.json"), "--output-dir", str(out)]
    assert main(argv) == 0
    records = json.loads((tmp_path / "t.json").read_text())["records"]
    assert len(records) == 5 and all(REQUIRED_FIELDS <= set(r) for r in records)
    assert {r["method"] for r in records} == set(resolve_auto(("auto",))[0])  # as2d with 3+ cores, else target
    captured = capsys.readouterr()
    assert "method auto: " in captured.err  # the start-up line says what auto chose
    printed = captured.out
    errors = words = 0
    for clip in clips:
        stem = clip.path.stem
        assert {p.suffix for p in out.glob(f"{stem}.*")} == {".txt", ".srt", ".vtt", ".tsv", ".json"}
        text = (out / f"{stem}.txt").read_text()
        assert text.strip() in printed  # the text on stdout is the text written
        subtitles = list(srt.parse((out / f"{stem}.srt").read_text()))
        assert subtitles and all(a.end <= b.start for a, b in zip(subtitles, subtitles[1:], strict=False))
        assert webvtt.read(str(out / f"{stem}.vtt")).captions
        clip_errors, clip_words = word_errors(clip.transcript, text)
        errors, words = errors + clip_errors, words + clip_words
    assert errors / words <= 0.10, f"WER {errors / words:.3f}"


@pytest.mark.real
def test_target_only_costs_one_call_per_token(tmp_path):
    clip = str(librivox_clips()[0].path)
    assert main(["transcribe", clip, "--method", "target", "--json", str(tmp_path / "t.json")]) == 0
    (record,) = json.loads((tmp_path / "t.json").read_text())["records"]
    # the prefill proposes the first token; each committed token then costs one call (the last finds the end)
    assert record["method"] == "target" and record["finish_reason"] == "eos"
    assert record["target_calls"] == record["n_tokens"] > 0


@pytest.mark.real
def test_long_file_seeks_by_timestamps_and_keeps_every_repeat(tmp_path):
    clips = librivox_clips()
    order = [0, 1, 2, 3, 4, 0, 1]  # 35.4 s: the 30 s mark falls inside the second "Dashwood" sentence
    long = np.concatenate([soundfile.read(str(clips[i].path), dtype="float32")[0] for i in order])
    soundfile.write(tmp_path / "long.flac", long, 16000)
    argv = ["transcribe", str(tmp_path / "long.flac"), "--method", "as2d", "--compare"]
    argv += ["--json", str(tmp_path / "t.json")]
    assert main([*argv, "--output-dir", str(tmp_path), "--output-format", "json"]) == 0
    report = json.loads((tmp_path / "t.json").read_text())
    windows = [r for r in report["records"] if r["method"] == "as2d"]
    assert len(windows) == 2 and 0 < windows[1]["start_s"] < 30.0  # the next window starts at a segment end
    assert report["exactness"]["passed"]
    text = json.loads((tmp_path / "long.json").read_text())["text"]
    assert text.count("Dashwood") == 2 and "ill-disposed" in text.replace("ill-sposed", "ill-disposed")


@pytest.mark.real
def test_beam_search_from_the_command_line_is_target_only_for_every_method(tmp_path, capsys):
    """`--beam-size 5`: As²d says it decodes the beams target-only, `--compare` checks every window
    equal to target-only's beam search, and the beams differ from greedy decoding somewhere (the
    flag reaches the decoder)."""
    joined = np.concatenate([soundfile.read(str(c.path), dtype="float32")[0] for c in librivox_clips()])
    soundfile.write(tmp_path / "joined.flac", joined, 16000)  # 24.7 s: beam 5 punctuates one sentence otherwise
    clip = str(tmp_path / "joined.flac")
    beam, greedy = tmp_path / "beam.json", tmp_path / "greedy.json"
    assert main(["transcribe", clip, "--method", "as2d", "--beam-size", "5", "--compare", "--json", str(beam)]) == 0
    assert "a beam search of 5 is decoded target-only" in capsys.readouterr().err
    report = json.loads(beam.read_text())
    assert report["exactness"]["passed"]
    assert main(["transcribe", clip, "--method", "target", "--json", str(greedy)]) == 0
    beams = [r["token_ids"] for r in report["records"] if r["method"] == "target"]
    assert beams != [r["token_ids"] for r in json.loads(greedy.read_text())["records"]]


@pytest.mark.parametrize(
    "args, message",
    [
        (["transcribe", "/nonexistent/clip.wav"], "no such file"),
        (["transcribe", "NOTAUDIO"], "not a readable audio file"),
        (["transcribe", "SILENT"], "silent"),
        (["transcribe", "SILENT", "--method", "warp"], "unknown method"),
        (["transcribe", "NOTAUDIO", "--model", "no-such-model"], "not a readable audio file"),
        (["generate", "--prompt", "   "], "prompt is empty"),
        (["transcribe", "SILENT_OK", "--method", "sd", "--budget", "0"], "--budget must be at least 1"),
        (["transcribe", "SILENT_OK", "--beam-size", "0"], "--beam-size must be at least 1"),
        (["transcribe", "SILENT_OK", "--patience", "0"], "--patience must be above 0"),
        (["replay"], "needs a trajectory file"),
        (["replay", "NOTAUDIO", "--profile", "NOTAUDIO"], "not a trajectory file"),
        (["profile", "--max-width", "0"], "--max-width"),
        (["select-budget", "--producers", "psychic"], "unknown producer"),
        (["select-budget", "--collections", "0"], "--collections must be in 1..10"),
        (["replay", "--validate", "--repeats", "0"], "--repeats must be in 1..20"),
        (["replay", "--validate", "--calibrate-every", "-1"], "--calibrate-every must be 0"),
        (["bench", "ondevice", "--oracle", "--profile", "/nonexistent/p.json"], "cost profile"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(tmp_path, capsys, args, message):
    (tmp_path / "notes.txt").write_text("not audio at all\n" * 10)
    soundfile.write(tmp_path / "silent.wav", np.zeros(8000), 16000)
    soundfile.write(tmp_path / "tone.wav", 0.3 * np.sin(np.arange(16000) / 5.0), 16000)
    files = {"NOTAUDIO": tmp_path / "notes.txt", "SILENT": tmp_path / "silent.wav", "SILENT_OK": tmp_path / "tone.wav"}
    args = [str(files[a]) if a in files else a for a in args]
    assert main(args) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1 and err.startswith("asyncspec: error:")


def test_unknown_model_is_a_clear_error(tmp_path, capsys):
    soundfile.write(tmp_path / "tone.wav", 0.3 * np.sin(np.arange(16000) / 5.0), 16000)
    assert main(["transcribe", str(tmp_path / "tone.wav"), "--model", "no-such-model"]) == EXIT_BAD_INPUT
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_generate_without_prepared_qwen_says_how_to_prepare(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    assert main(["generate", "--prompt", "def add(a, b):"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "asyncspec models prepare qwen2.5-coder-1.5b" in err


@pytest.mark.real
def test_the_console_script_skips_its_teardown_only_after_every_output_is_written(tmp_path):
    """`transcribe` ends with os._exit (cli.entry): its text still reaches a pipe and its files
    are complete; a failing run keeps its exit code and its message."""
    clip = str(min(librivox_clips(), key=lambda c: c.path.stat().st_size).path)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "asyncspec", "transcribe", clip, "--method", "target", "--output-dir", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    stem = Path(clip).stem
    written = json.loads((out / f"{stem}.json").read_text())
    assert written["text"].strip() and written["text"].strip() in done.stdout
    assert (out / f"{stem}.txt").read_text().strip() == written["text"].strip()
    assert f"wrote {out}" in done.stderr
    failed = subprocess.run([*command[:4], "/nonexistent.wav"], capture_output=True, text=True, timeout=120)
    assert failed.returncode == EXIT_BAD_INPUT and "no such file" in failed.stderr


def test_console_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "asyncspec", "models", "list"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0
    assert "whisper-base" in done.stdout and "qwen2.5-coder-1.5b" in done.stdout


@pytest.mark.real
def test_compare_checks_equality_and_saves_traces(tmp_path):
    from asyncspec.trace import Trace

    clip = str(librivox_clips()[1].path)
    trace_file = tmp_path / "trace.json"
    argv = ["transcribe", clip, "--method", "sd,specasr", "--compare", "--json", str(tmp_path / "t.json")]
    argv += ["--temperature-increment-on-fallback", "0"]
    assert main([*argv, "--trace", str(trace_file)]) == 0
    report = json.loads((tmp_path / "t.json").read_text())
    records = report["records"]
    assert report["exactness"]["passed"] and set(report["summary"]) == {"target", "sd", "specasr"}
    assert [r["method"] for r in records] == ["target", "sd", "specasr"]
    assert all(r["equal_to_target"] is True for r in records)
    assert all({"acceptance", "mean_accepted_len"} <= set(r) for r in records)
    assert records[1]["target_calls"] < records[0]["target_calls"]
    saved = json.loads(trace_file.read_text())
    assert [entry["method"] for entry in saved] == ["target", "sd", "specasr"]
    trace_file.write_text(json.dumps(saved[1]))
    events = Trace.load(trace_file).events
    assert {"prefill", "draft", "verify"} <= {e.stage for e in events}
    assert all(a.end <= b.start + 1e-9 for a, b in zip(events, events[1:], strict=False))  # serial, monotonic


@pytest.mark.real
def test_bench_ondevice_writes_json_and_plots(tmp_path, capsys):
    import shutil

    audio = tmp_path / "audio"
    audio.mkdir()
    shutil.copy(librivox_clips()[4].path, audio / "clip.wav")
    out = tmp_path / "out"
    flat = {IDLE: {0: {k: [0.03 + 0.002 * k] for k in range(1, 26)}}}  # a made-up profile: only the plumbing
    CostProfile("whisper-base", "bf16", flat, 0.0002, 0.002, 0.0003, 2e-5).save(tmp_path / "profile.json")
    oracle = ["--oracle", "--profile", str(tmp_path / "profile.json"), "--catalog", "ct2-chunk@4s"]
    assert main(["bench", "ondevice", "--audio", str(audio), "--out", str(out), *oracle]) == 0
    report = json.loads((out / "bench_ondevice.json").read_text())
    assert 0 < report["oracle"]["deployed_ratio"] <= 1 and report["oracle"]["pooled_tps"] > 0
    assert report["oracle"]["windows"] == 1
    assert (out / "bench_ondevice_oracle.png").stat().st_size > 10_000
    for method in ("target", "sd", "specasr", "as2d"):
        figures = report["methods"][method]
        assert {"pooled_tps", "ratio_to_target", "slower_than_target_fraction", "equal_windows", "windows"} <= set(
            figures
        )
        assert figures["windows"] == 1 and figures["equal_windows"] == 1
    assert (out / "bench_ondevice_cdf.png").stat().st_size > 10_000
    assert (out / "bench_ondevice_timeline.png").stat().st_size > 10_000
    assert "pooled" in capsys.readouterr().out
    # As²d alone beside target-only (no sd runs to check): it crashed on the sd budgets' zip
    assert main(["bench", "ondevice", "--audio", str(audio), "--out", str(out / "as2d"), "--method", "as2d"]) == 0
    alone = json.loads((out / "as2d" / "bench_ondevice.json").read_text())["methods"]
    assert set(alone) == {"target", "as2d"} and alone["as2d"]["equal_windows"] == 1


@pytest.mark.real
def test_profile_writes_a_cost_profile_and_its_plot(tmp_path, capsys):
    args = ["profile", "--max-width", "3", "--repetitions", "2", "--offsets", "0,8", "--out", str(tmp_path)]
    assert main(args) == 0
    profile = CostProfile.load(tmp_path / "profile.json")
    assert profile.widths == [1, 2, 3] and set(profile.verify) == {IDLE, CONCURRENT}
    assert all(len(profile.verify[IDLE][o][k]) == 2 for o in (0, 8) for k in (1, 2, 3))
    assert 0 < profile.verify_s(1, 0) < 1 and profile.align_s > 0 and profile.target_gap_s > 0
    assert (tmp_path / "profile_saving.png").stat().st_size > 10_000
    beside = json.loads((tmp_path / "profile_transformers.json").read_text())  # the other engine's V(K)
    assert beside["engine"] == "transformers" and sorted(int(k) for k in beside["v_ms"]) == [1, 2, 3]
    assert all(0 < v < 1000 for v in beside["v_ms"].values())
    # the verdict recorded is the one transformers' forward earns on this CPU, computed here again
    from asyncspec.models.registry import load_decoder
    from asyncspec.models.selftest import check_invariance

    again = check_invariance(load_decoder("whisper-base", beside["dtype"], engine="transformers"))
    recorded = beside["self_test"]
    assert (recorded["passed"], recorded["rows_checked"]) == (
        again.passed,
        again.rows_checked,
    ) and again.rows_checked > 0
    assert recorded["rows_differing"] == again.rows_differing
    output = capsys.readouterr().out
    assert "R(K)" in output and "transformers ms" in output
