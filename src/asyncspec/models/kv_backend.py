"""What the transformers backends share: KV bookkeeping, rollback, the greedy rule."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from asyncspec.models.base import DecoderState
from asyncspec.models.logits import greedy_tokens, project_logits
from asyncspec.models.tokenizer import TextTokenizer


class KVBackend:
    """Subclasses provide `_hidden(state, ids)`, `_output_weight()` and `_suppressed(state, n)`."""

    name: str
    tokenizer: TextTokenizer
    eos_ids: frozenset[int]
    vocab_size: int
    max_length: int
    dtype: torch.dtype

    @torch.inference_mode()
    def extend(self, state: DecoderState, tokens: Sequence[int]) -> torch.Tensor:
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("extend needs at least one token")
        if state.length + len(tokens) > self.max_length:
            raise ValueError(
                f"{self.name}: {state.length + len(tokens)} positions exceed the model's {self.max_length}"
            )
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{self.name}: token ids {bad[:5]} are outside the vocabulary")
        hidden = self._hidden(state, torch.tensor([tokens]))[0]  # [N, D]
        logits = project_logits(hidden, self._output_weight(), None, self._suppressed(state, len(tokens)))
        state.tokens.extend(tokens)
        state.next_logits = logits[-1]
        return logits

    def rollback(self, state: DecoderState, length: int) -> None:
        if not 0 < length <= state.length:
            raise ValueError(f"rollback to {length} outside 1..{state.length}")
        removed = state.length - length
        if removed:
            self._crop(state, removed)
            del state.tokens[length:]
            state.next_logits = None

    def greedy(self, logits: torch.Tensor) -> list[int]:
        return greedy_tokens(logits)

    def cache_length(self, state: DecoderState) -> int:
        """Positions actually held in the KV cache (tests check it equals state.length)."""
        return self._self_attention_cache(state).get_seq_length()

    def _crop(self, state: DecoderState, removed: int) -> None:
        self._self_attention_cache(state).crop(-removed)

    def _self_attention_cache(self, state: DecoderState):
        return state.cache

    def _suppressed(self, state: DecoderState, n: int) -> torch.Tensor | None:
        return None
