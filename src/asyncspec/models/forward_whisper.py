"""Whisper's decoder written over a static KV cache (models/fixed_shape.py), reusing the loaded
modules' weights (whisper_model.py's, or transformers' of the same names). Pre-LN layers:
self-attention, cross-attention over the encoder output, MLP; queries are scaled before the
product, as in the reference implementation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from asyncspec.models.attention_record import record_cross_attention
from asyncspec.models.fixed_shape import (
    ATTENTION_DTYPE,
    RowSlot,
    StaticKV,
    attend_all,
    attend_causal,
    attend_prompt,
    row_positions,
    write_rows,
)
from asyncspec.models.int8_attention import QuantizedKeys, QuantizedValues, quantize_keys, quantize_values
from asyncspec.models.int8_linear import SideBySide, shared_input
from asyncspec.models.scripted_step import ScriptedWhisperStep, scriptable_cross


class WhisperBlockForward:
    def __init__(self, model: Any, block_rows: int | None = None, integer_attention: bool = False):
        """model: ours or transformers' Whisper. integer_attention: cross-attention scores and weighted
        sums in int8 (int8_attention.py), for the int8 engine."""
        self.decoder = model.model.decoder
        # the decoding call's width: a stacked call's cross-attention runs one block at a time
        self.block_rows = block_rows
        self.integer_attention = integer_attention
        config = model.config
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.hidden_size = config.d_model
        self.dtype = next(self.decoder.parameters()).dtype  # the encoder may run in another dtype
        self.last_position = config.max_target_positions - 1
        # built after the int8 engine replaced the linears (kv_backend._init_engine), as the engine is
        self.self_projections = [
            SideBySide([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj])
            for layer in self.decoder.layers
        ]
        stacked = [projections.stacked for projections in self.self_projections]
        # the decoding call as one TorchScript graph, the same bits (scripted_step.py)
        self.scripted = ScriptedWhisperStep.build(self.decoder, self.heads, stacked) if integer_attention else None

    @torch.inference_mode()
    def new_cache(self, slots: int, context: torch.Tensor | None) -> StaticKV:
        """context: the encoder output [1, T, D] in the model's dtype; cross K/V computed once."""
        if context is None:
            raise ValueError("a Whisper decoder cache needs the encoder output")
        cache = StaticKV.empty(len(self.decoder.layers), self.heads, slots, self.head_dim)
        attentions = [layer.encoder_attn for layer in self.decoder.layers]
        projections = [linear for attention in attentions for linear in (attention.k_proj, attention.v_proj)]
        projected = shared_input(projections, context[0].to(self.dtype))
        for keys, values in zip(projected[::2], projected[1::2], strict=True):
            # values transposed once here: attend_all multiplies with the call's rows as columns (float),
            # and the int8 engine quantizes each channel, now a row, over the frames
            values_t = self._heads(values).to(ATTENTION_DTYPE).transpose(1, 2).contiguous()
            keys = self._heads(keys).to(ATTENTION_DTYPE)
            if self.integer_attention:
                cache.cross.append((quantize_keys(keys), quantize_values(values_t)))
            else:
                cache.cross.append((keys, values_t))
        return cache

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[N, H * D_h] -> [H, N, D_h]"""
        return x.view(x.shape[0], self.heads, self.head_dim).transpose(0, 1)

    @torch.inference_mode()
    def __call__(
        self,
        slots: Sequence[RowSlot],
        ids: torch.Tensor,
        prompt: bool = False,
        widths: Callable[[int], int] | None = None,
    ) -> torch.Tensor:
        """Final hidden states [W, D]. The rows may belong to requests over different encoder outputs
        (the chunks of a batched transcription side by side): each run of consecutive rows over one
        output attends to it alone, at `widths(rows)` columns, the width a call of those rows alone
        runs at (the engine's `decoding_width`), so its bits are the ones that call computes."""
        groups = cross_groups(slots, ids.shape[0])
        if len(groups) > 1 and (prompt or widths is None):
            raise ValueError("rows over several encoder outputs need a decoding call and the engine's widths")
        positions = row_positions(slots, ids.shape[0], self.last_position)  # padding rows may overrun
        if self.scripted is not None and not prompt and len(groups) == 1 and self._graph_computes(slots, ids.shape[0]):
            return self.scripted(ids, positions, slots)
        x = self.decoder.embed_tokens(ids) * self.decoder.embed_scale
        x = x + self.decoder.embed_positions.weight[positions].to(x.dtype)
        for index, layer in enumerate(self.decoder.layers):
            x = x + self._self_attention(layer, layer.self_attn_layer_norm(x), slots, index, prompt)
            h = layer.encoder_attn_layer_norm(x)
            if len(groups) == 1:
                block = None if prompt else self.block_rows
                x = x + self._cross_attention(layer, h, slots[0].cache.cross[index], slots, index, block)
            else:
                x = x + self._grouped_cross_attention(layer, h, groups, slots, index, widths)
            x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        return self.decoder.layer_norm(x)

    def _graph_computes(self, slots: Sequence[RowSlot], width: int) -> bool:
        """Does the call fit one cross-attention block, with no attention record (word timestamps)
        on any of its requests: the decoding calls the scripted graph computes?"""
        if self.block_rows is not None and width > self.block_rows:
            return False
        return scriptable_cross(slots[0].cache.cross) and all(slot.cache.attention is None for slot in slots)

    def _self_attention(self, layer, h, slots: Sequence[RowSlot], index: int, prompt: bool) -> torch.Tensor:
        attention = layer.self_attn
        q, k, v = self.self_projections[index](h)
        queries = self._heads(q * attention.scaling)
        keys = [slot.cache.keys[index] for slot in slots]
        values = [slot.cache.values[index] for slot in slots]
        write_rows(keys, slots, self._heads(k))
        write_rows(values, slots, self._heads(v))
        if prompt:
            out = attend_prompt(queries, keys[0], values[0], slots[0].position, len(slots), scale=1.0)
        else:
            out = attend_causal(queries, keys, values, slots, scale=1.0)
        return attention.out_proj(out.to(h.dtype))

    def _cross_attention(
        self,
        layer,
        h,
        cross: tuple[torch.Tensor | QuantizedKeys, torch.Tensor | QuantizedValues],
        slots: Sequence[RowSlot],
        index: int,
        block: int | None,
    ) -> torch.Tensor:
        attention = layer.encoder_attn
        queries = self._heads(attention.q_proj(h) * attention.scaling)
        recording = any(slot.cache.attention is not None for slot in slots)
        observe = (lambda weights: record_cross_attention(slots, index, weights)) if recording else None
        out = attend_all(queries, cross[0], cross[1], scale=1.0, observe=observe, block=block)
        return attention.out_proj(out.to(h.dtype))

    def _grouped_cross_attention(
        self, layer, h, groups: list[tuple[int, int]], slots: Sequence[RowSlot], index: int, widths
    ) -> torch.Tensor:
        """Cross-attention of a call whose rows attend to several encoder outputs: each group
        [start, end) of rows over one output attends in a product of its own, its queries padded
        (the group's last row repeated) to the width a call of its rows alone has. The output
        projection then takes the whole call, as in any call: rows never see each other there."""
        attention = layer.encoder_attn
        queries = self._heads(attention.q_proj(h) * attention.scaling)
        parts = []
        for start, end in groups:
            mine = slots[start : min(end, len(slots))]  # the real rows: the call's padding joins the last group
            rows, width = len(mine), widths(len(mine))
            group = queries[:, start : start + rows]
            if width > rows:
                group = torch.cat([group, group[:, -1:].expand(-1, width - rows, -1)], dim=1)
            recording = any(slot.cache.attention is not None for slot in mine)
            observe = (lambda weights, mine=mine: record_cross_attention(mine, index, weights)) if recording else None
            keys, values_t = mine[0].cache.cross[index]
            out = attend_all(group, keys, values_t, scale=1.0, observe=observe)[:rows]
            parts += [out, out[-1:].expand(end - start - rows, -1)]  # padding rows: any finite values
        return attention.out_proj(torch.cat(parts).to(h.dtype))


def cross_groups(slots: Sequence[RowSlot], width: int) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive rows over one encoder output; the call's padding
    rows (past the slots) join the last run."""
    groups, start = [], 0
    for row in range(1, len(slots)):
        if slots[row].cache.cross is not slots[start].cache.cross:
            groups.append((start, row))
            start = row
    groups.append((start, width))
    return groups
