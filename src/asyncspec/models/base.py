"""The one interface every decoding backend implements.

A backend owns its KV state, its greedy decision rule and its logit masks, so that target-only
decoding and every speculative method see identical logits for identical prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from asyncspec.models.tokenizer import TextTokenizer


@dataclass(frozen=True)
class DecodeRequest:
    """What a decoder is asked for: a prompt (token ids) and, for speech models, 16 kHz audio."""

    prompt_ids: tuple[int, ...]
    audio: np.ndarray | None = None  # float32 [samples] at 16 kHz, at most one window
    max_new_tokens: int = 256
    # the target's encoder output for `audio` when already computed (a window decoded again at a
    # fallback temperature encodes once); only the target that computed it may read it
    encoded: Any = None
    # word timestamps: an attention_record.AttentionSink in which the target keeps its states'
    # alignment-head weights (None: nothing is recorded)
    attention: Any = None


@dataclass
class DecoderState:
    """Per-request KV state. `tokens` are exactly the ids whose keys/values the cache holds."""

    tokens: list[int]
    prompt_len: int
    cache: Any
    # float32 [V]: logits after the last token in `tokens`; None right after a rollback
    next_logits: torch.Tensor | None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.tokens)


class Decoder(Protocol):
    """prefill -> extend* -> rollback; logits are float32 with the backend's masks applied."""

    name: str
    tokenizer: TextTokenizer
    eos_ids: frozenset[int]
    vocab_size: int
    max_length: int  # prompt + output positions the model supports

    def prefill(self, request: DecodeRequest) -> DecoderState: ...

    def extend(self, state: DecoderState, tokens: Sequence[int]) -> torch.Tensor:
        """Append tokens to the state; returns float32 logits [len(tokens), V], row i predicting
        the token after tokens[i]. Also sets state.next_logits to the last row."""
        ...

    def rollback(self, state: DecoderState, length: int) -> None:
        """Keep only the first `length` tokens' state; nothing of the dropped tokens survives."""
        ...

    def greedy(self, logits: torch.Tensor) -> list[int]:
        """The backend's greedy decision for each row of logits [..., V]."""
        ...

    @property
    def precision(self) -> str:
        """What the decoder computes in: "int8", "bf16", "fp32" or "fp16"."""
        ...

    def describe(self) -> str:
        """One line for a user: the model and the precision it computes in."""
        ...


def call_width(decoder) -> int | None:
    """Rows of every call of a fixed-shape decoder (its verification width), None for any other."""
    return getattr(decoder, "call_width", None)


def call_sizes(decoder) -> tuple[int, ...] | None:
    """The rows a fixed-shape decoder's call may run at on this thread count (its proven narrow
    widths and its full width), None for a decoder whose calls take any width."""
    engine = getattr(decoder, "engine", None)
    if engine is None or not hasattr(engine, "decoding_width"):
        return None
    return tuple(sorted({engine.decoding_width(rows) for rows in range(1, engine.shape.width + 1)}))
