"""Exactness on real speech, in both dtypes: As²d, sd and specasr reproduce target-only output
token for token on every LibriVox clip and on longer windows joined from them (10-25 s)."""

from __future__ import annotations

import numpy as np
import pytest

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.data.windows import librivox_windows
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models.pre_encoded import PreEncodedTarget
from conftest import BF16_REAL

JOINED = ("librivox-10s", "librivox-15s", "librivox-25s")  # one window of each length


def real_windows() -> list[tuple[str, np.ndarray]]:
    clips = [(clip.path.name, load_audio(clip.path)) for clip in librivox_clips()]
    joined, seen = [], set()
    for dataset, name, samples in librivox_windows():
        if dataset in JOINED and dataset not in seen:
            seen.add(dataset)
            joined.append((f"{dataset}/{name}", samples))
    return clips + joined


@pytest.mark.real
@pytest.mark.parametrize("dtype", [BF16_REAL, "fp32"])
def test_every_method_equals_target_only_on_real_speech(dtype):
    from asyncspec.models.offline import ct2_model_dir
    from asyncspec.models.registry import load_decoder
    from asyncspec.ondevice.producer import ProducerProcess, ProducerSpec

    target = load_decoder("whisper-base", dtype)
    drafter = load_decoder("whisper-tiny.en", dtype, engine="transformers")
    spec = ProducerSpec(
        model_dir=str(ct2_model_dir("whisper-tiny.en")), target_tokenizer_json=target.tokenizer.backend.to_str()
    )
    producer = ProducerProcess(spec)
    cached = PreEncodedTarget(target)  # four methods, one encoder pass per window
    checked = 0
    try:
        for name, samples in real_windows():
            request = target.request(samples)
            reference = METHODS["target"](cached, None, request, DecodeConfig()).tokens
            assert len(reference) > 5, name
            for method, helper in (("sd", drafter), ("specasr", drafter), ("as2d", producer)):
                tokens = METHODS[method](cached, helper, request, DecodeConfig()).tokens
                assert tokens == reference, f"{method} differs from target-only on {name} ({dtype})"
                checked += 1
    finally:
        producer.close()
    assert checked == 3 * (len(librivox_clips()) + len(JOINED))
