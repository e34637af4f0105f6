"""Whisper without transformers on the transcription path (models/log_mel.py, models/whisper_model.py):
the features and the loaded weights against transformers' own, the encoder's forward against
transformers' encoder, malformed directories refused, and a fresh process that loads the target
without importing transformers (the start-up claim), with the transformers engine as the control
that does import it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.errors import InputError
from asyncspec.models.log_mel import log_mel, log_mel_tensor, mel_filters
from asyncspec.models.whisper_model import load_whisper
from conftest import real_model_dir


def _real_audio() -> np.ndarray:
    return load_audio(librivox_clips()[0].path)


def test_mel_filters_are_whispers_filterbank_one_filter_per_row():
    from transformers import WhisperFeatureExtractor

    filters = mel_filters(80)
    assert filters.shape == (80, 201) and filters.dtype == np.float32
    np.testing.assert_allclose(filters, WhisperFeatureExtractor(feature_size=80).mel_filters.T, atol=1e-7)
    # Each triangle is one contiguous run of frequency bins, rising from the low ones to the high ones.
    peaks = filters.argmax(axis=1)
    assert (np.diff(peaks) >= 0).all() and peaks[-1] > 150


@pytest.mark.real
def test_log_mel_matches_transformers_feature_extractor_on_real_speech():
    from transformers import WhisperFeatureExtractor

    audio = _real_audio()
    extractor = WhisperFeatureExtractor(feature_size=80)
    window = extractor(audio, sampling_rate=16_000, return_tensors="np").input_features
    ours = log_mel(audio, 80)
    assert ours.shape == window.shape == (1, 80, 3000) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, window, atol=1e-4)
    # the target's form: the very features transformers' torch path computes, bit for bit
    assert torch.equal(
        log_mel_tensor(audio, 80), extractor(audio, sampling_rate=16_000, return_tensors="pt").input_features
    )
    chunk = audio[:50_000]  # the producer's form: the chunk's own length, no padding to 30 s
    own_length = extractor(chunk, sampling_rate=16_000, padding="longest", return_tensors="np").input_features
    np.testing.assert_allclose(log_mel(chunk, 80, pad_to=None), own_length, atol=1e-4)
    # control: the same comparison tells a time-shifted signal apart
    shifted = log_mel(np.roll(audio, 80), 80)
    assert np.abs(shifted - window).max() > 1e-2


@pytest.mark.real
def test_loaded_weights_and_encoder_match_transformers():
    from transformers import WhisperForConditionalGeneration

    source = real_model_dir("whisper-base")
    ours = load_whisper(source, torch.float32)
    reference = WhisperForConditionalGeneration.from_pretrained(str(source), dtype=torch.float32).eval()
    theirs = reference.state_dict()
    for key, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs[key]), key
    assert ours.proj_out.weight.data_ptr() == ours.model.decoder.embed_tokens.weight.data_ptr()
    features = log_mel_tensor(_real_audio(), 80)
    with torch.inference_mode():
        mine = ours.model.encoder(features).last_hidden_state
        expected = reference.model.encoder(features).last_hidden_state
    assert mine.shape == (1, 1500, 512)
    torch.testing.assert_close(mine, expected, atol=1e-4, rtol=1e-4)
    # control: one layer's weights perturbed by 1e-3 is far outside that bound
    with torch.inference_mode():
        ours.model.encoder.layers[3].fc1.weight.add_(1e-3)
        perturbed = ours.model.encoder(features).last_hidden_state
    assert (perturbed - expected).abs().max() > 1e-3


@pytest.mark.real
def test_a_bf16_decoder_leaves_the_encoder_the_files_weights():
    """The encoder's dtype is placed by measurement; its fp32 candidate must be the file's weights
    (fp16, which fp32 holds exactly), not weights rounded to the decoder's bf16 on the way."""
    from asyncspec.models.hf_whisper import _hf_model

    source = real_model_dir("whisper-base")
    exact = load_whisper(source, torch.float32).model.encoder.state_dict()
    for model in (load_whisper(source, torch.bfloat16), _hf_model(source, torch.bfloat16)):
        assert model.proj_out.weight.dtype == next(model.model.decoder.parameters()).dtype == torch.bfloat16
        encoder = model.model.encoder.state_dict()
        assert encoder.keys() == exact.keys()
        assert all(torch.equal(encoder[key], exact[key]) for key in exact)
    # control: the whole model cast to bf16 and its encoder back to fp32 (the load before) differs
    rounded = load_whisper(source, torch.float32).model.encoder.to(torch.bfloat16).float().state_dict()
    assert not all(torch.equal(rounded[key], exact[key]) for key in exact)


@pytest.mark.real
def test_malformed_model_directories_are_refused(tmp_path):
    source = real_model_dir("whisper-tiny.en")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "d_model": 256}))
    with pytest.raises(Exception, match="size mismatch|do not match"):
        load_whisper(tmp_path, torch.float32)
    (tmp_path / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    with pytest.raises(InputError, match="gelu only"):
        load_whisper(tmp_path, torch.float32)
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    with pytest.raises(InputError, match="not a Whisper config"):
        load_whisper(tmp_path, torch.float32)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(InputError, match="config.json"):
        load_whisper(tmp_path, torch.float32)


_PROBE = """
import sys
from asyncspec.models.registry import load_decoder
target = load_decoder("whisper-tiny.en", "fp32", engine=sys.argv[1], encoder="fp32")
target.prefill(target.request(__import__("numpy").zeros(16000, dtype="float32")))
print(sorted({name.split(".")[0] for name in sys.modules} & {"transformers"}))
"""


@pytest.mark.real
def test_the_fixed_shape_target_loads_and_runs_without_importing_transformers():
    def imported(engine: str) -> str:
        done = subprocess.run([sys.executable, "-c", _PROBE, engine], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    assert imported("fixed-shape") == "[]"
    assert imported("transformers") == "['transformers']"  # control: the probe sees an import
