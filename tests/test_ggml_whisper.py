"""The whisper.cpp (ggml) conversion of the prepared Whisper weights: its layout, its cache, and
whisper.cpp itself (pywhispercpp, the bench extra) loading and transcribing real speech with it,
against a corrupted copy that must do far worse."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct

import numpy as np
import pytest

from asyncspec.data.librivox import librivox_clips
from asyncspec.models import ggml_whisper
from asyncspec.models.ggml_whisper import (
    F16,
    F32,
    GGML_MAGIC,
    ggml_file,
    ggml_name,
    read_tensor_index,
    vocabulary_bytes,
    write_ggml,
)
from asyncspec.text_metrics import word_errors
from conftest import real_model_dir

requires_whispercpp = pytest.mark.skipif(
    importlib.util.find_spec("pywhispercpp") is None,
    reason="pywhispercpp not installed (pip install '.[bench]')",
)
# whisper-base with whisper.cpp's CLI settings gets 1 word wrong in 71 on the five clips (the
# reference's "a a amiable" stutter); 5 % leaves room for a different build's float rounding.
WER_BOUND = 0.05
# The corrupted controls get every word wrong; anything near the real file's WER would mean the
# test could not tell a broken conversion from a good one.
CORRUPT_WER_FLOOR = 0.8


def test_transformers_names_map_to_whisper_cpp_names():
    assert ggml_name("model.encoder.conv1.weight") == "encoder.conv1.weight"
    assert ggml_name("model.encoder.layers.3.self_attn.q_proj.bias") == "encoder.blocks.3.attn.query.bias"
    assert ggml_name("model.decoder.layers.0.encoder_attn.k_proj.weight") == "decoder.blocks.0.cross_attn.key.weight"
    assert ggml_name("model.decoder.layers.5.fc2.weight") == "decoder.blocks.5.mlp.2.weight"
    assert ggml_name("model.decoder.embed_tokens.weight") == "decoder.token_embedding.weight"
    assert ggml_name("model.encoder.layer_norm.bias") == "encoder.ln_post.bias"
    with pytest.raises(Exception, match="no whisper.cpp tensor"):
        ggml_name("model.decoder.layers.0.mystery.weight")


def test_vocabulary_is_the_bpe_tokens_as_bytes_below_endoftext():
    base = vocabulary_bytes(real_model_dir("whisper-base") / "tokenizer.json")
    tiny = vocabulary_bytes(real_model_dir("whisper-tiny.en") / "tokenizer.json")
    assert len(base) == 50257 and len(tiny) == 50256  # whisper.cpp adds the special tokens
    assert base[264] == b" the" and tiny[262] == b" the" and base[220] == b" "
    assert base[50256] == b""  # the multilingual vocabulary's empty token, which whisper.cpp expects


@pytest.mark.real
def test_file_layout_matches_whisper_cpps_loader(tmp_path):
    source = real_model_dir("whisper-tiny.en")
    path = tmp_path / "tiny.bin"
    write_ggml(source, path)
    data = path.read_bytes()
    header = struct.unpack_from("<I11i", data)
    assert header == (GGML_MAGIC, 51864, 1500, 384, 6, 4, 448, 384, 6, 4, 80, F16)
    assert struct.unpack_from("<2i", data, 48) == (80, 201)
    index = read_tensor_index(path)
    assert len(index) == 7 + 15 * 4 + 4 + 24 * 4  # the tensors whisper_model_load creates for 4 + 4 layers
    assert index["encoder.conv1.weight"][1:] == ((384, 80, 3), F16)
    assert index["encoder.conv1.bias"][1:] == ((384, 1), F32)
    assert index["encoder.positional_embedding"][1:] == ((1500, 384), F32)
    assert index["decoder.token_embedding.weight"][1:] == ((51864, 384), F16)
    assert index["decoder.blocks.3.cross_attn_ln.bias"][1:] == ((384,), F32)
    offset, shape, _ = index["decoder.token_embedding.weight"]
    from safetensors import safe_open

    with safe_open(str(source / "model.safetensors"), framework="numpy") as weights:
        expected = weights.get_tensor("model.decoder.embed_tokens.weight")
    stored = np.frombuffer(data, "<f2", count=expected.size, offset=offset).reshape(shape)
    assert np.array_equal(stored, expected)  # float16 in, float16 out: the weights are not rounded


@pytest.mark.real
def test_the_cached_file_is_rebuilt_when_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(ggml_whisper, "cache_root", lambda: tmp_path)
    builds = []
    real_write = ggml_whisper.write_ggml
    monkeypatch.setattr(ggml_whisper, "write_ggml", lambda *a, **k: builds.append(1) or real_write(*a, **k))
    path = ggml_file("whisper-tiny.en")
    marker = path.with_suffix(".json")
    assert path == tmp_path / "ggml" / "whisper-tiny.en.bin" and len(builds) == 1
    assert json.loads(marker.read_text())["bytes"] == path.stat().st_size
    assert ggml_file("whisper-tiny.en") == path and len(builds) == 1  # current: kept
    good = path.read_bytes()

    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, one bit off
    assert ggml_file("whisper-tiny.en").read_bytes() == good and len(builds) == 2
    recorded = json.loads(marker.read_text())
    marker.write_text(json.dumps(recorded | {"converter_version": 0}))  # built by an older converter
    ggml_file("whisper-tiny.en")
    inputs = json.loads(marker.read_text())["inputs"] | {"model.safetensors": "0" * 64}
    marker.write_text(json.dumps(recorded | {"inputs": inputs}))  # built from other weights
    ggml_file("whisper-tiny.en")
    marker.unlink()
    ggml_file("whisper-tiny.en")
    assert len(builds) == 5 and path.read_bytes() == good
    assert sorted(p.name for p in path.parent.iterdir()) == ["whisper-tiny.en.bin", "whisper-tiny.en.json"]


def _corpus_wer(system, clips) -> tuple[float, list]:
    errors = words = 0
    transcripts = []
    for clip in clips:
        transcripts.append(system.transcribe(clip.path))
        edits, count = word_errors(clip.transcript, transcripts[-1].text)
        errors, words = errors + edits, words + count
    return errors / words, transcripts


@pytest.mark.real
@requires_whispercpp
def test_whisper_cpp_transcribes_librivox_with_the_converted_base_file():
    from asyncspec.benchmarks.e2e_whispercpp import WhisperCppSystem

    system = WhisperCppSystem("whisper-base", threads=1)  # builds the file, checks whisper.cpp accepts it
    clips = librivox_clips()
    wer, transcripts = _corpus_wer(system, clips)
    assert wer <= WER_BOUND, [t.text for t in transcripts]
    transcript = transcripts[0]
    assert transcript.segments and transcript.text == " ".join(text for _, _, text in transcript.segments)
    assert all(0 <= start < end <= 7.2 for start, end, _ in transcript.segments)  # the clip is 7.1 s
    settings = system.settings()
    assert settings["strategy"] == "beam_search" and settings["beam_search"]["beam_size"] == 5
    assert system.model._params.greedy["best_of"] == 5  # the CLI's fallback width, not the binding's -1


@pytest.mark.real
@requires_whispercpp
def test_the_english_only_tiny_file_loads_and_transcribes():
    """tiny.en has no language tokens: whisper.cpp tells the vocabularies apart by n_vocab alone."""
    from asyncspec.benchmarks.e2e_whispercpp import WhisperCppSystem

    wer, transcripts = _corpus_wer(WhisperCppSystem("whisper-tiny.en", threads=1), librivox_clips()[:1])
    assert wer <= 0.1, transcripts[0].text  # 0 of 22 words wrong (3 of 71 on all five clips)


@pytest.mark.real
@requires_whispercpp
def test_corrupted_files_are_refused_or_transcribe_far_worse(tmp_path):
    from asyncspec.benchmarks.e2e_whispercpp import WhisperCppSystem, loads_in_whispercpp

    good = ggml_file("whisper-base")
    clips = librivox_clips()[:1]
    # The token embedding zeroed in place, found through the file's own index.
    zeroed = tmp_path / "zeroed.bin"
    shutil.copy(good, zeroed)
    offset, shape, kind = read_tensor_index(zeroed)["decoder.token_embedding.weight"]
    with open(zeroed, "r+b") as f:
        f.seek(offset)
        f.write(bytes(int(np.prod(shape)) * (2 if kind == F16 else 4)))
    # The filterbank written with its axes swapped but the same header: a silent layout mistake.
    swapped = tmp_path / "swapped.bin"
    write_ggml(
        real_model_dir("whisper-base"),
        swapped,
        lambda name, a: a.T.copy().reshape(a.shape) if name == "mel_filters" else a,
    )
    for path in (zeroed, swapped):
        if loads_in_whispercpp(path):
            wer, transcripts = _corpus_wer(WhisperCppSystem(str(path), threads=1, check_load=False), clips)
            assert wer >= CORRUPT_WER_FLOOR, (path.name, [t.text for t in transcripts])
    # A tensor of the wrong shape is refused by whisper.cpp's loader, and by the system up front.
    short = tmp_path / "short.bin"
    write_ggml(
        real_model_dir("whisper-base"), short, lambda name, a: a[:-1] if name == "decoder.positional_embedding" else a
    )
    assert not loads_in_whispercpp(short)
    with pytest.raises(Exception, match="refuses"):
        WhisperCppSystem(str(short), threads=1)


@pytest.mark.real
@requires_whispercpp
def test_a_cold_run_loads_and_transcribes_in_a_fresh_process():
    from asyncspec.benchmarks.e2e_whispercpp import cold_run

    clip = librivox_clips()[1]
    result = cold_run(ggml_file("whisper-base"), [clip.path], threads=1)
    [record] = result["files"]
    assert word_errors(clip.transcript, record["text"])[0] <= 1 and record["segments"]
    assert 0 < result["load_s"] < result["wall_s"] and record["seconds"] < result["wall_s"]
    assert result["settings"]["beam_search"]["beam_size"] == 5
