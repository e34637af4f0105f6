"""Record CTranslate2's own greedy tokens for the offline Whisper models on the LibriVox clips.

The converter test (tests/test_ct2_converter.py) compares the converted transformers models
against these. CTranslate2 comes with faster-whisper (the bench extra); the models are the
prepared CTranslate2 directories (`asyncspec models prepare`):

    .venv/bin/python scripts/record_ct2_reference.py
"""

from __future__ import annotations

import json
from pathlib import Path

import ctranslate2
import numpy as np
from transformers import WhisperFeatureExtractor

from asyncspec.audio import SAMPLE_RATE, load_audio
from asyncspec.benchmarks.e2e_systems import ct2_directory
from asyncspec.data.librivox import librivox_clips

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "ct2_reference_tokens.json"
PROMPTS = {"whisper-base": [50258, 50259, 50359, 50363], "whisper-tiny.en": [50257, 50362]}


def main() -> None:
    features = WhisperFeatureExtractor(feature_size=80)  # transformers' mel: shares no code with ours
    reference: dict[str, dict[str, list[int]]] = {}
    for name, prompt in PROMPTS.items():
        whisper = ctranslate2.models.Whisper(str(ct2_directory(name)), compute_type="float32")
        reference[name] = {}
        for clip in librivox_clips():
            mel = features(load_audio(clip.path), sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
            batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel, dtype=np.float32))
            result = whisper.generate(batch, [prompt], beam_size=1, max_length=448)[0]
            reference[name][clip.path.name] = result.sequences_ids[0]
            print(name, clip.path.name, len(result.sequences_ids[0]))
    document = {"compute_type": "float32", "ctranslate2": ctranslate2.__version__, "tokens": reference}
    OUT.write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
