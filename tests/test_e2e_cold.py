"""The cold-process harness (a fresh process per run, wall from spawn to exit) and faster-whisper's
long-form preset. The harness itself is checked with stand-in commands; the real run is one short
LibriVox clip through faster-whisper, as the asyncspec command line is wired separately."""

from __future__ import annotations

import json
import sys

import pytest

from asyncspec.benchmarks.e2e_cold import (
    ASYNCSPEC_COMMAND,
    cold_asyncspec,
    cold_faster_whisper,
    expand_command,
    read_output_dir,
)
from asyncspec.benchmarks.e2e_systems import FasterWhisperSystem, Segment, faster_whisper_installed
from asyncspec.data.librivox import librivox_clips
from asyncspec.text_metrics import word_errors, word_recall

requires_faster_whisper = pytest.mark.skipif(not faster_whisper_installed(), reason="pip install 'asyncspec[bench]'")

# Stands in for `asyncspec transcribe --output-format json --output-dir DIR FILE...`: sleeps, then
# writes whisper-style <stem>.json files, so the harness is tested without a model.
FAKE_TRANSCRIBE = """
import json, pathlib, sys, time
time.sleep(0.3)
out, files = pathlib.Path(sys.argv[1]), sys.argv[2:]
for f in files:
    stem = pathlib.Path(f).stem
    segments = [{"start": 0.0, "end": 1.5, "text": " hello"}, {"start": 1.5, "end": 2.0, "text": " " + stem}]
    (out / (stem + ".json")).write_text(json.dumps({"text": " hello " + stem, "segments": segments}))
"""


def shortest_clip():
    return min(librivox_clips(), key=lambda clip: clip.path.stat().st_size)


def non_decreasing(segments: list[Segment]) -> bool:
    times = [t for segment in segments for t in (segment.start, segment.end)]
    return all(a <= b for a, b in zip(times, times[1:], strict=False))


def test_the_asyncspec_command_fills_its_placeholders(tmp_path):
    argv = expand_command(ASYNCSPEC_COMMAND, [tmp_path / "a.wav", tmp_path / "b.wav"], tmp_path / "out", "as2d")
    assert argv[1:] == [
        "transcribe",
        "--language",
        "en",
        "--method",
        "as2d",
        "--output-format",
        "json",
        "--output-dir",
        str(tmp_path / "out"),
        str(tmp_path / "a.wav"),
        str(tmp_path / "b.wav"),
    ]
    assert argv[0].endswith("asyncspec")


def test_a_cold_run_times_the_process_and_reads_its_outputs(tmp_path):
    files = [tmp_path / "one.wav", tmp_path / "two.wav"]
    command = [sys.executable, "-c", FAKE_TRANSCRIBE, "{output_dir}", "{files}"]
    run = cold_asyncspec(files, command=command)
    assert run.returncode == 0 and run.ok
    assert run.wall_s >= 0.3  # the stand-in's sleep is inside the measured wall
    assert run.texts == ["hello one", "hello two"]
    assert run.segments[1] == [Segment(0.0, 1.5, "hello"), Segment(1.5, 2.0, "two")]
    assert json.loads(json.dumps(run.record()))["returncode"] == 0


def test_a_failing_command_keeps_its_exit_code_and_no_texts(tmp_path):
    command = [sys.executable, "-c", "import sys; sys.stderr.write('no such option'); sys.exit(2)", "{files}"]
    run = cold_asyncspec([tmp_path / "a.wav"], command=command)
    assert (run.returncode, run.texts, run.ok) == (2, [""], False)
    assert run.record()["stderr_tail"] == "no such option"


def test_a_process_past_its_timeout_is_killed(tmp_path):
    command = [sys.executable, "-c", "import time; time.sleep(30)"]
    run = cold_asyncspec([tmp_path / "a.wav"], command=command, timeout_s=0.5)
    assert run.returncode < 0 and run.wall_s < 10 and not run.ok


def test_missing_outputs_read_as_empty(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"text": " A. ", "segments": [[0, 1, " A."]]}))
    texts, segments = read_output_dir(tmp_path, [tmp_path / "a.wav", tmp_path / "b.wav"])
    assert texts == ["A.", ""] and segments == [[Segment(0.0, 1.0, "A.")], []]


@pytest.mark.real
@requires_faster_whisper
def test_faster_whisper_longform_greedy_gives_ordered_segments():
    clip = shortest_clip()
    system = FasterWhisperSystem("whisper-base", "int8", 1, "longform-greedy")
    try:
        transcript = system.transcribe(clip.path)
        settings = system.settings()
    finally:
        system.close()
    assert transcript.segments and non_decreasing(transcript.segments)
    assert transcript.text == " ".join(segment.text for segment in transcript.segments)
    # Only beam_size differs from faster-whisper's defaults: timestamps, conditioning, fallback, best of 5.
    ran = settings["transcribe"]
    assert (ran["beam_size"], ran["best_of"], ran["without_timestamps"]) == (1, 5, False)
    assert ran["condition_on_previous_text"] and len(ran["temperature"]) > 1
    assert ran["no_speech_threshold"] == 0.6 and ran["compression_ratio_threshold"] == 2.4


@pytest.mark.real
@requires_faster_whisper
def test_a_cold_faster_whisper_process_transcribes_a_clip():
    clip = shortest_clip()
    run = cold_faster_whisper([clip.path], preset="longform-greedy", threads=1, timeout_s=300)
    assert run.ok, run.stderr_tail
    assert run.system == "faster-whisper-int8-greedy"
    errors, words = word_errors(clip.transcript, run.texts[0])
    assert errors / words <= 0.2 and word_recall(clip.transcript, run.texts[0]) >= 0.8
    assert run.segments[0] and non_decreasing(run.segments[0])
    assert run.wall_s > 0.5  # a fresh interpreter, faster-whisper's imports and the model load
