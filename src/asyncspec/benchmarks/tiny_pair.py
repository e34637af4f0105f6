"""A tiny random target/drafter pair saved as transformers directories, so `asyncspec serve` processes
can load them (`--model DIR`): the benchmark's quick mode (`--models tiny`, tests, CI).

The target is a 2-layer Qwen3 (a saved Qwen2 gets transformers' BPE tokenizer forced on it) with a
word-level vocabulary 'w0'..'w94' + '<eos>'; its output head is
scaled so that its distributions are peaked like a language model's, and the drafter is the same model
with a perturbed head: it agrees with the target often but not always.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

TINY_VOCAB = 96
HEAD_SCALE = 15.0
DRAFTER_NOISE = 0.1


def _word_tokenizer() -> tokenizers.Tokenizer:
    words = {f"w{i}": i for i in range(TINY_VOCAB - 1)} | {"<eos>": TINY_VOCAB - 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="w0"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<eos>"])
    return backend


def _model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = TINY_VOCAB - 1
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return model


def _save(model: Qwen3ForCausalLM, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    _word_tokenizer().save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "TokenizersBackend", "eos_token": "<eos>", "unk_token": "w0"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def save_tiny_pair(directory: Path, noise: float = DRAFTER_NOISE) -> tuple[Path, Path]:
    """(target_dir, drafter_dir) under `directory`."""
    target, drafter = _model(), _model()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        drafter.lm_head.weight.add_(noise * torch.randn(drafter.lm_head.weight.shape, generator=generator))
    return _save(target, directory / "tiny-target"), _save(drafter, directory / "tiny-drafter")


def tiny_prompts(n: int, seed: int = 0) -> list[str]:
    """Word prompts of 3-10 tokens the tiny tokenizer encodes one id per word."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 11, (n,), generator=generator).tolist()
    return [
        " ".join(f"w{int(i)}" for i in torch.randint(0, TINY_VOCAB - 1, (k,), generator=generator)) for k in lengths
    ]
