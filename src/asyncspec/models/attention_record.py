"""The cross-attention weights of Whisper's alignment heads, kept per position while a window is
decoded, for word timestamps (transcription/word_timing.py).

The record lives in the request's fixed-shape cache (`StaticKV.attention`) and follows the cache's
own rule: a call writes each real row's weights at that row's position, and a rollback only moves
the length, so a position is rewritten before it is read again. After a decode, every committed
position therefore holds the weights of the row whose input was its committed token, computed
over its committed prefix: the same row target-only decoding computes, whichever method decoded
the window. Nothing is decoded again; recording adds a copy of [heads, frames] per row and layer.

The weights are the engine's own softmax over all 1,500 encoder frames; restricting them to the
window's frames and renormalising equals a softmax over those frames alone, which is what
openai-whisper and faster-whisper compute."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


def alignment_heads(model_dir: str | Path | None, layers: int, heads: int) -> tuple[tuple[int, int], ...]:
    """(layer, head) pairs: the model's own list (the CTranslate2 config we ship has it), else
    openai-whisper's default for a model without one, every head of the second half of the layers."""
    config = Path(model_dir) / "ct2_config.json" if model_dir is not None else None
    if config is not None and config.is_file():
        listed = json.loads(config.read_text()).get("alignment_heads")
        if listed:
            return tuple((int(layer), int(head)) for layer, head in listed)
    return tuple((layer, head) for layer in range(layers // 2, layers) for head in range(heads))


@dataclass
class AttentionRecord:
    """weights[p, k]: the weights over the encoder frames of alignment head k for the row at position p."""

    by_layer: dict[int, tuple[int, list[int]]]  # layer -> (first column in weights, its heads)
    weights: torch.Tensor  # float32 [slots, alignment heads, frames]

    @classmethod
    def empty(cls, heads: Sequence[tuple[int, int]], slots: int, frames: int) -> AttentionRecord:
        by_layer: dict[int, tuple[int, list[int]]] = {}
        for column, (layer, head) in enumerate(heads):
            by_layer.setdefault(layer, (column, []))[1].append(head)
        # uninitialised, as the KV cache: only positions a call wrote are ever read
        return cls(by_layer, torch.empty(slots, len(heads), frames, dtype=torch.float32))

    def copy(self) -> AttentionRecord:
        return AttentionRecord(self.by_layer, self.weights.clone())

    def rows(self, positions: Sequence[int]) -> torch.Tensor:
        """[len(positions), alignment heads, frames]."""
        return self.weights[list(positions)]


def record_cross_attention(slots: Sequence[Any], layer: int, weights: torch.Tensor) -> None:
    """weights [H, W, T] of one layer's cross-attention in a call: each real row's alignment heads
    into its own request's record, at its position (rows of requests without a record: nothing)."""
    for row, slot in enumerate(slots):
        record = slot.cache.attention
        if record is None or not slot.real or layer not in record.by_layer:
            continue
        column, heads = record.by_layer[layer]
        record.weights[slot.position, column : column + len(heads)] = weights[heads, row]


@dataclass
class AttentionSink:
    """Asks a target to record its decoder states' alignment weights for one window's request:
    every state it prefills for the request, and every copy of one (fallback draws), is kept here,
    so the state of whichever draw is chosen can be read afterwards. Only `owner` records (a
    drafter given the same request does not)."""

    owner: Any
    states: list = field(default_factory=list)

    def state_for(self, tokens: Sequence[int]):
        """The kept state whose cache holds `tokens` (prompt and output) from position 0, or None."""
        wanted = list(tokens)
        for state in self.states:
            if state.tokens[: len(wanted)] == wanted:
                return state
        return None
