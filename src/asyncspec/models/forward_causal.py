"""A Llama-layout causal LM (Qwen2, Qwen3, Llama) written over a static KV cache
(models/fixed_shape.py), reusing the loaded transformers modules' weights: RMSNorm, rotary q/k
(Qwen3 normalises each head's q and k first), grouped-query attention, gated MLP."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from asyncspec.models.fixed_shape import (
    RowSlot,
    StaticKV,
    attend_causal,
    attend_prompt,
    row_positions,
    write_rows,
)
from asyncspec.models.int8_linear import SideBySide
from asyncspec.models.scripted_causal import ScriptedCausalStep

SUPPORTED_TYPES = frozenset({"qwen2", "qwen3", "llama"})


class CausalBlockForward:
    def __init__(self, model):
        config = model.config
        if config.model_type not in SUPPORTED_TYPES:
            raise ValueError(f"the fixed-shape engine supports {sorted(SUPPORTED_TYPES)}, not {config.model_type!r}")
        if getattr(config, "use_sliding_window", False):
            raise ValueError("the fixed-shape engine does not implement sliding-window attention")
        self.model = model.model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden_size = config.hidden_size
        self.scale = self.head_dim**-0.5
        self._rotary: tuple[torch.Tensor, torch.Tensor] | None = None
        # built after the int8 engine replaced the linears (kv_backend._init_engine), as the engine is
        self.projections = [
            SideBySide([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj])
            for layer in self.model.layers
        ]
        stacked = [projections.stacked for projections in self.projections]
        # every decoding call as one TorchScript graph, the same bits (scripted_causal.py)
        self.scripted = ScriptedCausalStep.build(self.model, self.heads, self.scale, stacked)

    def new_cache(self, slots: int, context: torch.Tensor | None) -> StaticKV:
        return StaticKV.empty(len(self.model.layers), self.kv_heads, slots, self.head_dim)

    def _rotary_table(self, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [slots, D_h] for every position, computed once (per-position values only), in
        the dtype of the embeddings."""
        if self._rotary is None or self._rotary[0].shape[0] < slots:
            like = self.model.embed_tokens.weight
            cos, sin = self.model.rotary_emb(like, torch.arange(slots).unsqueeze(0))
            self._rotary = (cos[0], sin[0])
        return self._rotary

    @torch.inference_mode()
    def __call__(
        self,
        slots: Sequence[RowSlot],
        ids: torch.Tensor,
        prompt: bool = False,
        widths: Callable[[int], int] | None = None,
    ) -> torch.Tensor:
        """`widths` is for encoder-decoder calls (BlockForward): a causal model's rows attend only
        to their own caches."""
        cos, sin = self._rotary_table(max(slot.cache.slots for slot in slots))
        positions = row_positions(slots, ids.shape[0])
        if self.scripted is not None and not prompt:
            return self.scripted(ids, positions, (cos, sin), slots)
        x = self.model.embed_tokens(ids)
        rotary = (cos[positions].unsqueeze(0), sin[positions].unsqueeze(0))
        for index, layer in enumerate(self.model.layers):
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), slots, index, rotary, prompt)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.norm(x)

    def _attention(self, attention, h, slots: Sequence[RowSlot], index: int, rotary, prompt: bool) -> torch.Tensor:
        width = h.shape[0]
        q, k, v = self.projections[index](h)
        queries = q.view(1, width, self.heads, self.head_dim).transpose(1, 2)
        keys = k.view(1, width, self.kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(attention, "q_norm"):  # Qwen3: RMSNorm over each head's dimensions (row-wise)
            queries, keys = attention.q_norm(queries), attention.k_norm(keys)
        values = v.view(width, self.kv_heads, self.head_dim).transpose(0, 1)
        queries, keys = apply_rotary_pos_emb(queries, keys, *rotary)
        cached_keys = [slot.cache.keys[index] for slot in slots]
        cached_values = [slot.cache.values[index] for slot in slots]
        write_rows(cached_keys, slots, keys[0])
        write_rows(cached_values, slots, values)
        if prompt:
            start = slots[0].position
            out = attend_prompt(queries[0], cached_keys[0], cached_values[0], start, len(slots), self.scale)
        else:
            out = attend_causal(queries[0], cached_keys, cached_values, slots, self.scale)
        return attention.o_proj(out.to(h.dtype))
