"""Offline weight assembly: a prepared cache verifies, and tampering with it is caught."""

from __future__ import annotations

import json

from asyncspec.cli import main
from asyncspec.models.offline import MANIFEST, model_dir, prepare, verify


def test_prepare_writes_a_manifest_that_verify_rechecks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    directory = prepare("whisper-tiny.en", log=lambda _: None)
    assert directory == model_dir("whisper-tiny.en") and directory.is_relative_to(tmp_path)
    manifest = json.loads((directory / MANIFEST).read_text())
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])
    assert verify("whisper-tiny.en") == []

    with open(directory / "model.safetensors", "r+b") as weights:  # flip one byte of the weights
        weights.seek(4096)
        byte = weights.read(1)
        weights.seek(4096)
        weights.write(bytes([byte[0] ^ 0xFF]))
    problems = verify("whisper-tiny.en")
    assert len(problems) == 1 and "model.safetensors has SHA-256" in problems[0]
    assert main(["models", "verify", "whisper-tiny.en"]) == 1
    assert "1 problem(s)" in capsys.readouterr().out
