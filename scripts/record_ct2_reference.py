"""Record CTranslate2's own greedy tokens for the offline Whisper models on the LibriVox clips.

The converter test compares the converted transformers models against these. Needs `ctranslate2`
(not a project dependency): pip install ctranslate2 && python scripts/record_ct2_reference.py
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import ctranslate2
import numpy as np
from transformers import WhisperFeatureExtractor

from asyncspec.audio import SAMPLE_RATE, load_audio
from asyncspec.datasets import librivox_clips
from asyncspec.models.offline import REGISTRY, package_file

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "ct2_reference_tokens.json"
PROMPTS = {"whisper-base": [50258, 50259, 50359, 50363], "whisper-tiny.en": [50257, 50362]}


def ct2_model_dir(name: str, work: Path) -> Path:
    model = REGISTRY[name]
    directory = work / name
    directory.mkdir()
    with open(directory / "model.bin", "wb") as out:
        for package, relative in model.parts:
            with open(package_file(package, relative), "rb") as part:
                shutil.copyfileobj(part, out)
    for package, relative in model.side_files:
        shutil.copy(package_file(package, relative), directory / Path(relative).name)
    vocabulary = package_file(model.side_files[0][0], str(Path(model.side_files[0][1]).parent))
    for candidate in ("vocabulary.json", "vocabulary.txt"):
        if (vocabulary / candidate).exists():
            shutil.copy(vocabulary / candidate, directory / candidate)
    return directory


def main() -> None:
    features = WhisperFeatureExtractor(feature_size=80)
    reference: dict[str, dict[str, list[int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, prompt in PROMPTS.items():
            whisper = ctranslate2.models.Whisper(str(ct2_model_dir(name, Path(tmp))), compute_type="float32")
            reference[name] = {}
            for clip in librivox_clips():
                mel = features(load_audio(clip.path), sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
                batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel, dtype=np.float32))
                result = whisper.generate(batch, [prompt], beam_size=1, max_length=448)[0]
                reference[name][clip.path.name] = result.sequences_ids[0]
                print(name, clip.path.name, len(result.sequences_ids[0]))
    OUT.write_text(
        json.dumps({"compute_type": "float32", "ctranslate2": ctranslate2.__version__, "tokens": reference}, indent=1)
    )


if __name__ == "__main__":
    main()
