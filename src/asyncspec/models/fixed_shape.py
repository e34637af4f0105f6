"""The target engine with one call shape: what makes speculative output equal target-only output.

A row's logits must not depend on the call that computed it. Kernels choose their blocking and
reduction order from the shapes they are given (matmul tiles, vectorised row reductions, the
attention's length), so a token computed in a one-token call and the same token computed as the
5th row of a verification call can differ in the last bits, and a near-tie then flips. Here every
call has one shape, whatever it carries:

- a static KV cache of a fixed number of slots per request (`capacity` + `width`), written in place;
- every call runs exactly `width` rows (a shorter call is padded, a longer one split into blocks);
  the prompt runs in blocks of `prefill_width` rows, the same blocks in every run of a request;
- attention of the row at position p runs over exactly the slots 0..p, one row at a time, so its
  shapes depend on p alone (and its cost on the real context, not on the cache's size);
- the output projection runs over all rows of a decoding block; of a prompt block, only the rows
  whose logits are read are projected, gathered into calls of `width` rows.

Rollback only moves the length pointer: a slot past it is rewritten before any row can see it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

ATTENTION_DTYPE = torch.float32  # scores, softmax and weighted sum; the cache is kept in it too


@dataclass
class StaticKV:
    """Per-request keys/values: one [H_kv, slots, D_h] tensor per layer and kind, in ATTENTION_DTYPE.
    `cross` holds an encoder-decoder model's cross-attention keys/values (read-only, shareable)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    cross: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    attention: Any = None  # an attention_record.AttentionRecord where word timestamps are wanted

    @classmethod
    def empty(cls, layers: int, kv_heads: int, slots: int, head_dim: int) -> StaticKV:
        # Uninitialised on purpose: a slot is written before any row reads it (a row reads only
        # slots 0..p), so zeroing a 4,096-slot cache per request (235 MB for Qwen 1.5B) is wasted
        # work, and untouched pages of a large allocation stay unmapped.
        shape = (kv_heads, slots, head_dim)
        return cls(
            [torch.empty(shape, dtype=ATTENTION_DTYPE) for _ in range(layers)],
            [torch.empty(shape, dtype=ATTENTION_DTYPE) for _ in range(layers)],
        )

    @property
    def slots(self) -> int:
        return self.keys[0].shape[1]

    def copy(self) -> StaticKV:
        """An independent self-attention cache; the cross-attention tensors are shared."""
        attention = None if self.attention is None else self.attention.copy()
        return StaticKV([k.clone() for k in self.keys], [v.clone() for v in self.values], self.cross, attention)

    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, *(t for pair in self.cross for t in pair)]
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class RowSlot:
    """Where one row of a call lives: its request's cache and its position in that request. The
    rows of one call may belong to different requests (a window's fallback draws share a call)."""

    cache: StaticKV
    position: int


def block_slots(cache: StaticKV, start: int, real_rows: int) -> list[RowSlot]:
    """The real rows of a one-request block at positions start, start + 1, ..."""
    return [RowSlot(cache, start + row) for row in range(real_rows)]


def write_rows(layer_tensors: Sequence[torch.Tensor], slots: Sequence[RowSlot], rows: torch.Tensor) -> None:
    """Each real row's [H_kv, D_h] of rows [H_kv, W, D_h] into layer_tensors[row] (its request's
    cache tensor of this layer and kind) at its own position."""
    for row, (tensor, slot) in enumerate(zip(layer_tensors, slots, strict=True)):
        tensor[:, slot.position] = rows[:, row].to(ATTENTION_DTYPE)


def attend_causal(
    queries: torch.Tensor,  # [H, W, D_h] in the model's dtype; row i at slots[i].position
    keys: Sequence[torch.Tensor],  # per real row: its request's [H_kv, slots, D_h], holding this call's rows
    values: Sequence[torch.Tensor],  # per real row, likewise
    slots: Sequence[RowSlot],  # the real rows; rows past them are padding: their output is zeros
    scale: float,
) -> torch.Tensor:  # [W, H * D_h] in ATTENTION_DTYPE
    """Causal self-attention, one row at a time over exactly its own request's prefix: the row at
    position p runs products of shape [group, D_h] x [D_h, p + 1], a function of p alone, whichever
    call it is in and whatever request sits beside it. So its cost follows the real context, not
    the cache's size, and its result is the same in every call. Grouped-query heads share their
    K/V without a copy."""
    heads, width, head_dim = queries.shape
    out = torch.zeros(width, heads * head_dim, dtype=ATTENTION_DTYPE)
    for row, slot in enumerate(slots):
        visible, kv_heads = slot.position + 1, keys[row].shape[0]
        # a fresh contiguous copy: the query's memory layout never depends on its row index
        q = queries[:, row].to(ATTENTION_DTYPE, copy=True).view(kv_heads, heads // kv_heads, head_dim)
        scores = torch.matmul(q, keys[row][:, :visible].transpose(1, 2))  # [H_kv, group, p + 1]
        weights = torch.softmax(scores * scale if scale != 1.0 else scores, dim=-1)
        out[row] = torch.matmul(weights, values[row][:, :visible]).reshape(-1)  # [H_kv, group, D_h]
    return out


def row_positions(slots: Sequence[RowSlot], width: int, last_position: int | None = None) -> torch.Tensor:
    """long [width]: each real row's position; padding rows repeat the last real one's."""
    positions = [slot.position for slot in slots]
    positions += [positions[-1]] * (width - len(positions))
    tensor = torch.tensor(positions)
    return tensor if last_position is None else tensor.clamp(max=last_position)


def attend_all(
    queries: torch.Tensor,  # [H, W, D_h] in the model's dtype
    keys: torch.Tensor,  # [H_kv, T, D_h] ATTENTION_DTYPE
    values: torch.Tensor,  # [H_kv, T, D_h] ATTENTION_DTYPE
    scale: float,
    observe: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:  # [W, H * D_h] in ATTENTION_DTYPE
    """Unmasked attention over a fixed-length memory (cross-attention over the encoder output):
    every call has the same [W, T] shape. `observe` is shown the weights [H, W, T] (read, never
    changed: the output is the same with or without it)."""
    heads, width, head_dim = queries.shape
    kv_heads = keys.shape[0]
    q = queries.to(ATTENTION_DTYPE).reshape(kv_heads, (heads // kv_heads) * width, head_dim)
    scores = torch.matmul(q, keys.transpose(1, 2))
    weights = torch.softmax(scores * scale if scale != 1.0 else scores, dim=-1)
    if observe is not None:
        observe(weights.view(heads, width, -1))
    out = torch.matmul(weights, values)  # [H_kv, group * W, D_h]
    return out.reshape(heads, width, head_dim).transpose(0, 1).reshape(width, heads * head_dim)


class BlockForward(Protocol):
    """A model family's decoder written over StaticKV: one block of rows at consecutive positions."""

    hidden_size: int

    def new_cache(self, slots: int, context: torch.Tensor | None) -> StaticKV: ...

    def __call__(self, slots: Sequence[RowSlot], ids: torch.Tensor) -> torch.Tensor:
        """ids long [W], the first len(slots) real (row i at slots[i]), the rest padding -> final
        hidden states [W, D]; writes each real row's keys/values into its cache at its position."""
        ...


@dataclass(frozen=True)
class CallShape:
    width: int  # rows of every decoding call (the verification width)
    prefill_width: int  # rows of every prompt block
    capacity: int  # positions a request may hold (prompt + output)

    @property
    def slots(self) -> int:
        # room for the padding rows of a block that starts at the last position
        return self.capacity + max(self.width, self.prefill_width)


class FixedShapeEngine:
    """Runs a BlockForward so that every call has one shape (see the module docstring)."""

    def __init__(
        self, forward: BlockForward, project: Callable[[torch.Tensor], torch.Tensor], shape: CallShape, pad_id: int = 0
    ):
        self.forward = forward
        self.project = project  # final hidden states [W, D] -> logits [W, V] (a float or an int8 linear)
        self.shape = shape
        self.pad_id = pad_id

    def new_cache(self, context: torch.Tensor | None = None) -> StaticKV:
        return self.forward.new_cache(self.shape.slots, context)

    def run(self, cache: StaticKV, start: int, tokens: Sequence[int]) -> torch.Tensor:
        """Logits [len(tokens), V] (the model's dtype) for tokens at positions start, start+1, ..."""
        width = self.shape.width
        rows = []
        for offset in range(0, len(tokens), width):
            chunk = list(tokens[offset : offset + width])
            logits = self.project(self._block(cache, start + offset, chunk, width))  # all rows: one shape
            rows.append(logits[: len(chunk)])
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def prefill(self, cache: StaticKV, start: int, tokens: Sequence[int], wanted: Sequence[int] = ()) -> torch.Tensor:
        """A prompt in blocks of `prefill_width` rows; logits [len(wanted), V] of the rows `wanted`
        (indices into tokens) alone. A prompt row's logits are rarely read (Whisper's no-speech
        probability reads one), and projecting every row of a block onto the vocabulary was most of
        a prompt's cost. The wanted rows are projected in calls of `width` rows, like decoding."""
        width, kept = self.shape.prefill_width, []
        for offset in range(0, len(tokens), width):
            chunk = list(tokens[offset : offset + width])
            hidden = self._block(cache, start + offset, chunk, width)
            kept += [hidden[index - offset] for index in wanted if offset <= index < offset + len(chunk)]
        if len(kept) != len(wanted):
            raise ValueError(f"wanted rows {list(wanted)} are not all inside the {len(tokens)} tokens")
        rows = []
        for offset in range(0, len(kept), self.shape.width):
            block = kept[offset : offset + self.shape.width]
            padded = torch.stack(block + [block[-1]] * (self.shape.width - len(block)))  # finite padding
            rows.append(self.project(padded)[: len(block)])
        return torch.cat(rows) if rows else torch.empty(0, 0)

    def run_rows(self, slots: Sequence[RowSlot], tokens: Sequence[int]) -> torch.Tensor:
        """Logits [len(tokens), V] of tokens[i] at slots[i], rows of different requests side by side
        in calls of `width` rows: each row is computed as in any call of the request's own (one
        shape, its own prefix), so packing requests together changes no bit of any of them."""
        width, rows = self.shape.width, []
        for offset in range(0, len(tokens), width):
            chunk = list(tokens[offset : offset + width])
            ids = torch.tensor(chunk + [self.pad_id] * (width - len(chunk)))
            rows.append(self.project(self.forward(slots[offset : offset + width], ids))[: len(chunk)])
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def _block(self, cache: StaticKV, start: int, chunk: list[int], width: int) -> torch.Tensor:
        ids = torch.tensor(chunk + [self.pad_id] * (width - len(chunk)))
        return self.forward(block_slots(cache, start, len(chunk)), ids)  # [width, D]
