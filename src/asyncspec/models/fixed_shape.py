"""The target engine with one call shape: what makes speculative output equal target-only output.

A row's logits must not depend on the call that computed it. Kernels choose their blocking and
reduction order from the shapes they are given (matmul tiles, vectorised row reductions, the
attention's length), so a token computed in a one-token call and the same token computed as the
5th row of a verification call can differ in the last bits, and a near-tie then flips. Here every
call has one shape, whatever it carries:

- a static KV cache of a fixed number of slots per request (`capacity` + `width`), written in place;
- every call runs exactly `width` rows (a shorter call is padded, a longer one split into blocks),
  or the narrowest width the self-test proved bitwise equal at this thread count (`narrow`, int8,
  each of a call's rows, of one request or several, computed alone); the prompt runs in blocks
  of `prefill_width` rows, the last one only as wide as the rows left (rounded up to a multiple
  of `width`): a function of the prompt's length, so the same blocks in every run of a request;
- attention of the row at position p runs over exactly the slots 0..p, one row at a time, so its
  shapes depend on p alone (and its cost on the real context, not on the cache's size); a prompt
  block's rows attend in one masked product instead (`attend_prompt`): a prompt row is computed
  only by `prefill`, in the same blocks in every run of a request, never beside other rows;
- the output projection runs over all rows of a decoding block; of a prompt block, only the rows
  whose logits are read are projected, gathered into calls of `width` rows;
- one exception, the cloud's stacked calls (`run_stacked`): several requests' blocks, each padded
  as in a call of its own, side by side in a call of 2, 4, 8 ... blocks, used only where the
  self-test's batch check found every block's rows bitwise those of its own call (selftest.py).

Rollback only moves the length pointer: a slot past it is rewritten before any row can see it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from asyncspec.models.call_stacks import cut_into_stacks
from asyncspec.models.int8_attention import QuantizedKeys, QuantizedValues, integer_scores, integer_weighted_sum

ATTENTION_DTYPE = torch.float32  # scores, softmax and weighted sum; the cache is kept in it too


@dataclass
class StaticKV:
    """Per-request keys/values: one [H_kv, slots, D_h] tensor per layer and kind, in ATTENTION_DTYPE.
    `cross` holds an encoder-decoder model's cross-attention keys [H_kv, T, D_h] (int8 engine:
    QuantizedKeys) and values, transposed [H_kv, D_h, T] (attend_all's layout; int8 engine:
    QuantizedValues), per layer (read-only, shareable)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    cross: list[tuple[torch.Tensor | QuantizedKeys, torch.Tensor | QuantizedValues]] = field(default_factory=list)
    attention: Any = None  # an attention_record.AttentionRecord where word timestamps are wanted

    @classmethod
    def empty(cls, layers: int, kv_heads: int, slots: int, head_dim: int) -> StaticKV:
        # Uninitialised on purpose: a slot is written before any row reads it (slots 0..p), so zeroing
        # a 4,096-slot cache (235 MB for Qwen 1.5B) is wasted work; untouched pages stay unmapped.
        shape = (kv_heads, slots, head_dim)
        return cls(
            [torch.empty(shape, dtype=ATTENTION_DTYPE) for _ in range(layers)],
            [torch.empty(shape, dtype=ATTENTION_DTYPE) for _ in range(layers)],
        )

    @property
    def slots(self) -> int:
        return self.keys[0].shape[1]

    def sibling(self) -> StaticKV:
        """An empty cache of the same shape over the same cross-attention memory (not recomputed)."""
        empty = StaticKV.empty(len(self.keys), self.keys[0].shape[0], self.slots, self.keys[0].shape[2])
        empty.cross = self.cross
        return empty

    def copy(self) -> StaticKV:
        """An independent self-attention cache; the cross-attention tensors are shared."""
        attention = None if self.attention is None else self.attention.copy()
        return StaticKV([k.clone() for k in self.keys], [v.clone() for v in self.values], self.cross, attention)

    def nbytes(self) -> int:
        cross = [t for keys, values_t in self.cross for t in (*cross_tensors(keys), *cross_tensors(values_t))]
        tensors = [*self.keys, *self.values, *cross]
        return sum(t.numel() * t.element_size() for t in tensors)


def cross_tensors(memory: torch.Tensor | QuantizedKeys | QuantizedValues) -> tuple[torch.Tensor, ...]:
    return (memory,) if isinstance(memory, torch.Tensor) else memory.tensors()


@dataclass(frozen=True)
class RowSlot:
    """Where one row of a call lives: its request's cache and its position in that request. The
    rows of one call may belong to different requests (a window's fallback draws share a call).
    A padding row inside a call (`real` False: a stacked call's padded block, `run_stacked`) holds
    its block's last real position, as the padding after a call's real rows does: nothing of it is
    written or attended."""

    cache: StaticKV
    position: int
    real: bool = True


def block_slots(cache: StaticKV, start: int, real_rows: int) -> list[RowSlot]:
    """The real rows of a one-request block at positions start, start + 1, ..."""
    return [RowSlot(cache, start + row) for row in range(real_rows)]


def padded_block_slots(cache: StaticKV, start: int, real_rows: int, width: int) -> list[RowSlot]:
    """`block_slots`, then padding rows up to `width` at the last real position: every row of a block
    in a stacked call where `row_positions` would put it in a call of its own."""
    padding = RowSlot(cache, start + real_rows - 1, real=False)
    return block_slots(cache, start, real_rows) + [padding] * (width - real_rows)


def write_rows(layer_tensors: Sequence[torch.Tensor], slots: Sequence[RowSlot], rows: torch.Tensor) -> None:
    """Each real row's [H_kv, D_h] of rows [H_kv, W, D_h] into layer_tensors[row] (its request's
    cache tensor of this layer and kind) at its own position. A run of rows bound for consecutive
    positions of one tensor is one slice copy (the same bits as row by row, in a fraction of the
    calls: a 224-row prompt wrote 2,688 single rows)."""
    for first, count in consecutive_runs(layer_tensors, slots):
        tensor, start = layer_tensors[first], slots[first].position
        tensor[:, start : start + count] = rows[:, first : first + count].to(ATTENTION_DTYPE)


def consecutive_runs(layer_tensors: Sequence[torch.Tensor], slots: Sequence[RowSlot]) -> list[tuple[int, int]]:
    """(first row, rows) of every maximal run of real rows at consecutive positions of one tensor."""
    runs: list[tuple[int, int]] = []
    for row, slot in enumerate(slots):
        if not slot.real:
            continue
        if runs:
            first, count = runs[-1]
            follows = first + count == row and slots[first].position + count == slot.position
            if follows and layer_tensors[first] is layer_tensors[row]:
                runs[-1] = (first, count + 1)
                continue
        runs.append((row, 1))
    return runs


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
        if not slot.real:
            continue  # a padding row: zeros, as past the real rows
        visible, kv_heads = slot.position + 1, keys[row].shape[0]
        # a fresh contiguous copy: the query's memory layout never depends on its row index
        q = queries[:, row].to(ATTENTION_DTYPE, copy=True).view(kv_heads, heads // kv_heads, head_dim)
        scores = torch.matmul(q, keys[row][:, :visible].transpose(1, 2))  # [H_kv, group, p + 1]
        weights = torch.softmax(scores * scale if scale != 1.0 else scores, dim=-1)
        out[row] = torch.matmul(weights, values[row][:, :visible]).reshape(-1)  # [H_kv, group, D_h]
    return out


def attend_prompt(
    queries: torch.Tensor,  # [H, W, D_h] in the model's dtype; the first `rows` real
    keys: torch.Tensor,  # the request's [H_kv, slots, D_h], holding this block's rows
    values: torch.Tensor,
    start: int,  # the position of the block's first row
    rows: int,
    scale: float,
) -> torch.Tensor:  # [W, H * D_h] in ATTENTION_DTYPE, padding rows zeros
    """Causal self-attention of a prompt block, its rows at positions start, start + 1, ... of one
    request: one product over slots 0..start + rows - 1, each row's later slots masked before the
    softmax. A row's bits here depend on its block, not on its position alone as in
    `attend_causal`, which is why only `FixedShapeEngine.prefill` uses it: every run of a request
    cuts its prompt into the same blocks. It replaces a Python loop of one small product per row
    and layer (a 185-token Whisper prompt: 1,344 of them, about a third of its prefill)."""
    heads, width, head_dim = queries.shape
    kv_heads, visible = keys.shape[0], start + rows
    group = heads // kv_heads
    q = queries[:, :rows].to(ATTENTION_DTYPE).reshape(kv_heads, group * rows, head_dim)
    scores = torch.matmul(q, keys[:, :visible].transpose(1, 2))  # [H_kv, group * rows, visible]
    scores = scores * scale if scale != 1.0 else scores
    later = torch.arange(visible) > torch.arange(start, visible).unsqueeze(1)  # [rows, visible]
    scores.view(kv_heads, group, rows, visible).masked_fill_(later, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    attended = torch.matmul(weights, values[:, :visible]).view(heads, rows, head_dim)
    out = torch.zeros(width, heads * head_dim, dtype=ATTENTION_DTYPE)
    out[:rows] = attended.transpose(0, 1).reshape(rows, heads * head_dim)
    return out


def row_positions(slots: Sequence[RowSlot], width: int, last_position: int | None = None) -> torch.Tensor:
    """long [width]: each real row's position; padding rows repeat the last real one's."""
    positions = [slot.position for slot in slots]
    positions += [positions[-1]] * (width - len(positions))
    tensor = torch.tensor(positions)
    return tensor if last_position is None else tensor.clamp(max=last_position)


def attend_all(
    queries: torch.Tensor,  # [H, W, D_h] in the model's dtype
    keys: torch.Tensor | QuantizedKeys,  # [H_kv, T, D_h] ATTENTION_DTYPE, or the int8 engine's
    values_t: torch.Tensor | QuantizedValues,  # [H_kv, D_h, T] ATTENTION_DTYPE: transposed, contiguous
    scale: float,
    observe: Callable[[torch.Tensor], None] | None = None,
    block: int | None = None,
) -> torch.Tensor:  # [W, H * D_h] in ATTENTION_DTYPE
    """Unmasked attention over a fixed-length memory (cross-attention over the encoder output):
    every call has the same [W, T] shape. The call's rows are the products' columns, never their
    rows: a float GEMM kernel may run a call's rows in register blocks, and then a row's bits depend
    on where it sits (MKL's AVX2 kernel takes 6 rows: rows 6 and 7 of an 8-row call came out
    different, Xeon capped to AVX2, 2026-12-04), whereas a column is a vector lane, computed alike
    wherever it sits. `observe` is shown the weights [H, W, T] (read, never changed: the output is
    the same with or without it).

    `block`: a call wider than that many rows (blocks stacked into one call) is attended one block
    at a time, each in the products of a one-block call. The number of columns is a GEMM's shape
    too: on a Zen 4 EPYC (family 25 model 17, one thread) a 16-column product gave a block's rows
    other bits than its own 8-column call, which the batch check's probe did not show."""
    heads, width, head_dim = queries.shape
    if block is not None and width > block:
        seen: list[torch.Tensor] = []  # each block's weights [H, block, T], shown together
        keep = seen.append if observe is not None else None
        parts = [attend_all(queries[:, at : at + block], keys, values_t, scale, keep) for at in range(0, width, block)]
        if observe is not None:
            observe(torch.cat(seen, dim=1))
        return torch.cat(parts)
    kv_heads = keys.shape[0]
    q = queries.to(ATTENTION_DTYPE).reshape(kv_heads, (heads // kv_heads) * width, head_dim)
    if isinstance(keys, QuantizedKeys):  # the int8 engine's: exact at any width (int8_attention.py)
        scores = integer_scores(q, keys)
    else:
        scores = torch.matmul(keys, q.transpose(1, 2)).transpose(1, 2).contiguous()  # [H_kv, group * W, T]
    weights = torch.softmax(scores * scale if scale != 1.0 else scores, dim=-1)  # per row: invariant
    if observe is not None:
        observe(weights.view(heads, width, -1))
    if isinstance(values_t, QuantizedValues):  # the int8 engine's: exact at any width
        out = integer_weighted_sum(weights, values_t)
    else:
        out = torch.matmul(values_t, weights.transpose(1, 2)).transpose(1, 2)  # [H_kv, group * W, D_h]
    return out.reshape(heads, width, head_dim).transpose(0, 1).reshape(width, heads * head_dim)


class BlockForward(Protocol):
    """A model family's decoder written over StaticKV: one block of rows at consecutive positions."""

    hidden_size: int

    def new_cache(self, slots: int, context: torch.Tensor | None) -> StaticKV: ...

    def __call__(
        self,
        slots: Sequence[RowSlot],
        ids: torch.Tensor,
        prompt: bool = False,
        widths: Callable[[int], int] | None = None,
    ) -> torch.Tensor:
        """ids long [W], the first len(slots) real (row i at slots[i]), the rest padding -> final
        hidden states [W, D]; writes each real row's keys/values into its cache at its position.
        `prompt`: the rows are a prompt block (one request, consecutive positions), whose
        self-attention may run as `attend_prompt`. `widths`: rows -> the width a call of that many
        rows runs at, for an encoder-decoder call whose rows attend to different encoder outputs."""
        ...


def prefill_blocks(length: int, shape: CallShape) -> list[int]:
    """The widths of the blocks a prompt of `length` rows is prefilled in: `prefill_width` while
    more rows are left, then the rest rounded up to a multiple of `width` (a function of the length
    alone: every run of a request cuts its prompt alike). A padded row costs what a real one does
    (a 226-token Whisper prompt: 178 ms in 32-row blocks, 94 ms in 128 + 104; docs/e2e.md)."""
    blocks, left = [], length
    while left > 0:
        blocks.append(min(shape.prefill_width, -(-left // shape.width) * shape.width))
        left -= blocks[-1]
    return blocks


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
        self.narrow: dict[int, tuple[int, ...]] = {}  # thread count -> proven narrower widths

    def decoding_width(self, rows: int) -> int:
        """The narrowest width proven at this thread count that holds `rows`, else the full width
        (a one-token whisper-base int8 call: 11.8 ms at 1 row, 14.3 at 8; two threads, Zen 4)."""
        proven = self.narrow.get(torch.get_num_threads(), ())
        return min((width for width in proven if width >= rows), default=self.shape.width)

    def new_cache(self, context: torch.Tensor | None = None) -> StaticKV:
        return self.forward.new_cache(self.shape.slots, context)

    def run(self, cache: StaticKV, start: int, tokens: Sequence[int]) -> torch.Tensor:
        """Logits [len(tokens), V] (the model's dtype) for tokens at positions start, start+1, ..."""
        rows = []  # each block at its decoding width: the padded rows' logits are dropped
        for offset in range(0, len(tokens), self.shape.width):
            chunk = list(tokens[offset : offset + self.shape.width])
            width = self.decoding_width(len(chunk))
            rows.append(self.project(self._block(cache, start + offset, chunk, width))[: len(chunk)])
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def prefill(self, cache: StaticKV, start: int, tokens: Sequence[int], wanted: Sequence[int] = ()) -> torch.Tensor:
        """A prompt in the blocks `prefill_blocks` cuts; logits [len(wanted), V] of the rows `wanted`
        (indices into tokens) alone. A prompt row's logits are rarely read (Whisper's no-speech
        probability reads one), and projecting every row of a block onto the vocabulary was most of
        a prompt's cost. The wanted rows are projected in calls of `width` rows, like decoding."""
        kept, offset = [], 0
        for width in prefill_blocks(len(tokens), self.shape):
            chunk = list(tokens[offset : offset + width])
            hidden = self._block(cache, start + offset, chunk, width, prompt=True)
            kept += [hidden[index - offset] for index in wanted if offset <= index < offset + len(chunk)]
            offset += len(chunk)
        if len(kept) != len(wanted):
            raise ValueError(f"wanted rows {list(wanted)} are not all inside the {len(tokens)} tokens")
        rows = []
        for offset in range(0, len(kept), self.shape.width):
            block = kept[offset : offset + self.shape.width]
            padded = torch.stack(block + [block[-1]] * (self.shape.width - len(block)))  # finite padding
            rows.append(self.project(padded)[: len(block)])
        return torch.cat(rows) if rows else torch.empty(0, 0)

    def run_rows(self, slots: Sequence[RowSlot], tokens: Sequence[int], most_blocks: int = 1) -> torch.Tensor:
        """Logits [len(tokens), V] of tokens[i] at slots[i], rows of different requests side by side
        in calls of `width` rows: each row is computed as in any call of the request's own (one
        shape, its own prefix), so packing requests together changes no bit of any of them. Rows of
        one request at consecutive positions may share a call, as a block's do: every row's keys
        and values are written, layer by layer, before any row attends. With `most_blocks` > 1 the
        rows' blocks of `width` are stacked into calls of 2, 4, ... blocks (`cut_into_stacks`): only
        where the self-test's batch check proved those stacks equal (see `run_stacked`). Rows that
        fit one call run at the narrowest proven width that holds them, as `run`'s do."""
        one_call = len(tokens) <= self.shape.width
        width, rows, done = self.decoding_width(len(tokens)) if one_call else self.shape.width, [], 0
        for blocks in cut_into_stacks(-(-len(tokens) // width), most_blocks):
            chunk = list(tokens[done : done + blocks * width])
            ids = torch.tensor(chunk + [self.pad_id] * (blocks * width - len(chunk)))
            hidden = self.forward(slots[done : done + len(chunk)], ids, widths=self.decoding_width)
            rows.append(self.project(hidden)[: len(chunk)])
            done += len(chunk)
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def run_stacked(self, parts: Sequence[tuple[StaticKV, int, Sequence[int]]], most_blocks: int) -> list[torch.Tensor]:
        """For each part (a request's cache, its start, its tokens): the logits [len(tokens), V] that
        `run` computes, its tokens cut into the same blocks of `width` rows padded the same way, but
        the blocks of all parts stacked into calls of 2, 4, ... `most_blocks` blocks (`cut_into_stacks`).
        Only the linears see the wider call (norms and self-attention are per row, cross-attention
        per block), so this is bitwise `run` where the self-test's batch check passed. Parts hold
        distinct caches; a part's later blocks read its earlier ones' keys/values, written first."""
        width = self.shape.width
        blocks = [
            (index, cache, start + offset, list(tokens[offset : offset + width]))
            for index, (cache, start, tokens) in enumerate(parts)
            for offset in range(0, len(tokens), width)
        ]
        rows: list[list[torch.Tensor]] = [[] for _ in parts]
        done = 0
        for count in cut_into_stacks(len(blocks), most_blocks):
            stack, done = blocks[done : done + count], done + count
            slots = [
                slot for _, cache, start, chunk in stack for slot in padded_block_slots(cache, start, len(chunk), width)
            ]
            ids = [token for *_, chunk in stack for token in chunk + [self.pad_id] * (width - len(chunk))]
            logits = self.project(self.forward(slots, torch.tensor(ids)))
            for at, (index, *_, chunk) in enumerate(stack):
                rows[index].append(logits[at * width : at * width + len(chunk)])
        return [torch.cat(part) if len(part) > 1 else part[0] for part in rows]

    def _block(self, cache: StaticKV, start: int, chunk: list[int], width: int, prompt: bool = False) -> torch.Tensor:
        ids = torch.tensor(chunk + [self.pad_id] * (width - len(chunk)))
        return self.forward(block_slots(cache, start, len(chunk)), ids, prompt=prompt)  # [width, D]
