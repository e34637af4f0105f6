"""Modules no other test reached, each run through its main function on the cheapest input and its
output checked: `asyncspec keys DIR`, the `listen --auto` figure, the long-form recordings, and
`bench engines` (on tiny random models, both engines, one short window)."""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest
import soundfile
import torch
from PIL import Image

from asyncspec.audio import SAMPLE_RATE, load_audio
from asyncspec.cli import EXIT_BAD_INPUT, main
from asyncspec.ondevice.buffer import CandidateBuffer
from conftest import synthetic_speech, tiny_whisper


def test_keys_command_writes_private_curve_pairs_and_allow_lists(tmp_path, capsys):
    from asyncspec.cloudedge.auth import client_keys, server_keys

    folder = tmp_path / "keys"
    assert main(["keys", str(folder), "--names", "cloud,edge,client,laptop"]) == 0
    out = capsys.readouterr().out
    for name in ("cloud", "edge", "client", "laptop"):
        assert (folder / f"{name}.key").is_file()
        assert stat.S_IMODE((folder / f"{name}.key_secret").stat().st_mode) == 0o600, name
    assert sorted(p.name for p in (folder / "cloud-clients").iterdir()) == ["edge.key"]
    assert sorted(p.name for p in (folder / "edge-clients").iterdir()) == ["client.key", "laptop.key"]
    assert f"--curve-clients {folder}/cloud-clients" in out
    cloud = server_keys(folder / "cloud.key_secret", folder / "cloud-clients")
    edge = client_keys(folder / "edge.key_secret", folder / "cloud.key")
    assert edge.server_public == cloud.public and len(cloud.public) == len(cloud.secret) == 40  # z85 of 32 bytes
    assert cloud.public != edge.public
    assert main(["keys", str(tmp_path / "other"), "--names", "cloud,../edge"]) == EXIT_BAD_INPUT


def test_the_listen_auto_figure_is_a_png_that_opens(tmp_path):
    from asyncspec.ondemand.figures import _trailing, plot_streaming
    from asyncspec.ondemand.streaming import BlockRecord

    records = [
        BlockRecord(
            i,
            4.0 * i,
            4.0 * i + 4,
            i % 3 == 0,
            4.0 * i + 4,
            0.1,
            0.2,
            0.1,
            0.5,
            0.8,
            0.9,
            0.2,
            0.25,
            20.0,
            10,
            False,
            0,
            "w",
        )
        for i in range(6)
    ]
    path = tmp_path / "listen_auto.png"
    plot_streaming(records, 4.0, path, "a title")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1] * 0.8 > 100
    assert _trailing([1.0, 3.0, 5.0], width=2) == [1.0, 2.0, 4.0]


def test_the_librivox_recording_is_the_clips_joined_and_reused(tmp_path):
    from asyncspec.data.librivox import librivox_clips
    from asyncspec.data.longform import librivox_recording

    path = librivox_recording(tmp_path / "rec.wav", min_seconds=30.0)
    samples = load_audio(path)
    clips = [load_audio(clip.path) for clip in librivox_clips()]
    once = sum(len(c) for c in clips)
    assert len(samples) == 2 * once  # whole orders until 30 s: two of 24.7 s
    first = np.concatenate(clips)
    assert np.abs(samples[:once] - first).max() < 1e-4  # the first order is the clips as listed (16-bit)
    written = path.stat().st_mtime_ns
    assert librivox_recording(path, min_seconds=30.0) == path and path.stat().st_mtime_ns == written  # reused


def test_the_synthesised_long_recording_lasts_and_is_reused(tmp_path):
    import shutil

    from asyncspec.data.longform import long_recording

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    path = long_recording(tmp_path / "long.wav", min_seconds=20.0)
    info = soundfile.info(str(path))
    assert info.samplerate == SAMPLE_RATE and info.channels == 1 and info.duration >= 20.0
    samples = load_audio(path)
    assert np.abs(samples).max() > 0.05  # speech, not silence
    written = path.stat().st_mtime_ns
    assert long_recording(path, min_seconds=20.0) == path and path.stat().st_mtime_ns == written


class _Idle:
    """A producer that publishes nothing (As²d then decodes one token a call, still exactly)."""

    def start(self, audio):
        buffer = CandidateBuffer(1)
        buffer.finished = True
        return buffer

    def finish(self, buffer):
        pass


def test_bench_engines_writes_its_report_and_figure(tmp_path, monkeypatch, capsys):
    from asyncspec.benchmarks import engines
    from asyncspec.models import registry

    loaded = []

    def load_decoder(model, dtype, engine="fixed-shape"):
        loaded.append((model, dtype, engine))
        return tiny_whisper(torch.float32, seed=3, engine=engine)

    monkeypatch.setattr(registry, "load_decoder", load_decoder)
    monkeypatch.setattr(engines, "_windows", lambda n: [synthetic_speech(2.0, seed=5)] * n)
    monkeypatch.setattr(
        engines, "_as2d", lambda target, requests: engines._throughput(target, _Idle(), requests, "as2d")
    )
    argv = ["bench", "engines", "--dtypes", "fp32", "--max-width", "3", "--repetitions", "1", "--windows", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert loaded == [("whisper-base", "fp32", "transformers"), ("whisper-base", "fp32", "fixed-shape")]
    report = json.loads((tmp_path / "engines.json").read_text())
    by_engine = report["results"]["fp32"]
    assert set(by_engine) == {"transformers", "fixed-shape"}
    assert by_engine["fixed-shape"]["self_test"]["passed"]  # shape-invariant by construction: As²d runs there
    for result in by_engine.values():
        assert list(result["v_ms"]) == ["1", "2", "3"] and all(v > 0 for v in result["v_ms"].values())
        assert result["target"]["tokens"] > 0
        if result["self_test"]["passed"]:
            assert result["as2d"]["exactness"]["passed"] and result["as2d"]["tokens"] == result["target"]["tokens"]
        else:
            assert "refused" in result["as2d"]
    with Image.open(tmp_path / "engines.png") as image:
        assert image.format == "PNG"
    out = capsys.readouterr().out
    assert "V(K) ms (median)" in out and "as2d exact" in out, out
    assert main([*argv[:3], "int4", "--out", str(tmp_path)]) == EXIT_BAD_INPUT
