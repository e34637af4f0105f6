"""The int8 causal LM's one-request decoding call (Qwen2, Llama layout) as one TorchScript graph:
the operators of forward_causal.py and of the transformers modules it calls (RMSNorm, rotary
embedding, SiLU-gated MLP), in the same order on the same tensors, so the same bits, without
Python between them (why and how: scripted_step.py, its Whisper twin).

Which calls: every decoding call (rows of any requests, padding anywhere); a model whose
heads are normalised (Qwen3's q_norm/k_norm), whose norms or activation are not the ones written
here, or whose linears are not all FBGEMM's or `torch._int_mm`'s, runs eagerly, and so does every
prompt block. `tests/test_scripted_step.py` compares the graph with the eager forward bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from asyncspec.models.int8_linear import QMAX, TINY
from asyncspec.models.scripted_step import (
    CallLayout,
    Linear,
    binding,
    compiled,
    graph_linears,
    linear_step,
    self_attention,
    write_runs,
)

NORMS = frozenset({"Qwen2RMSNorm", "LlamaRMSNorm"})  # each: x * rsqrt(mean(x^2) + eps), times weight
ACTIVATIONS = frozenset({"SiLUActivation", "SiLU"})  # each: torch.nn.functional.silu


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2RMSNorm / LlamaRMSNorm on fp32 rows (its casts to fp32 and back are no-ops)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one tensor: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (turned * sin)


def _causal(
    ids: torch.Tensor,
    positions: torch.Tensor,
    rows: list[tuple[int, int, int]],
    runs: list[tuple[int, int, int, int]],
    embedding: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    norms: list[torch.Tensor],
    eps: float,
    linears: list[Linear],
    heads: int,
    scale: float,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    tiny: float,
    qmax: float,
) -> torch.Tensor:
    """forward_causal.CausalBlockForward.__call__ for a decoding call: final hidden states.
    keys/values: every layer's cache tensor of each request in the call, layer by layer."""
    width, layers = ids.shape[0], len(linears) // 5
    caches = len(keys) // layers
    x = torch.embedding(embedding, ids)
    cos, sin = cos_table[positions].unsqueeze(0).unsqueeze(1), sin_table[positions].unsqueeze(0).unsqueeze(1)
    kv_heads, head_dim = keys[0].shape[0], keys[0].shape[2]
    for layer in range(layers):
        # a layer's 5 linears (q|k|v, o, gate, up, down), its 2 norms, its first cache tensor
        n, at, kv = 5 * layer, 2 * layer, caches * layer
        h = _rms_norm(x, norms[at], eps)
        sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        q, k, v = linear_step(h, linears[n], tiny, qmax).split(sizes, dim=-1)
        queries = _rotated(q.view(1, width, heads, head_dim).transpose(1, 2), cos, sin)
        rotated_keys = _rotated(k.view(1, width, kv_heads, head_dim).transpose(1, 2), cos, sin)
        write_runs(keys, kv, rotated_keys[0], runs)
        write_runs(values, kv, v.view(width, kv_heads, head_dim).transpose(0, 1), runs)
        attended = self_attention(queries[0], keys, values, kv, rows, scale)
        x = x + linear_step(attended, linears[n + 1], tiny, qmax)
        h = _rms_norm(x, norms[at + 1], eps)
        gate = torch.nn.functional.silu(linear_step(h, linears[n + 2], tiny, qmax))
        x = x + linear_step(gate * linear_step(h, linears[n + 3], tiny, qmax), linears[n + 4], tiny, qmax)
    return _rms_norm(x, norms[2 * layers], eps)


class ScriptedCausalStep:
    """The scripted decoding call of one int8 causal LM, over its modules' own tensors; `build`
    returns None where the graph does not cover the model (the eager forward runs)."""

    def __init__(self, model: Any, heads: int, scale: float, linears: list[Any], bindings: list[tuple], graph: Any):
        self.graph, self.heads, self.scale = graph, heads, scale
        self.embedding = model.embed_tokens.weight
        self.norms = [norm.weight for norm in _norms(model)]
        self.eps = float(model.norm.variance_epsilon)
        self.linears = graph_linears(linears, bindings)

    @classmethod
    def build(cls, model: Any, heads: int, scale: float, stacked_projections: list[Any]) -> ScriptedCausalStep | None:
        """model: transformers' inner model (`.layers`, `.norm`); stacked_projections: each layer's
        q|k|v linear (Int8Linear.side_by_side), or None."""
        layers = model.layers
        linears = [
            linear
            for layer, stacked in zip(layers, stacked_projections, strict=True)
            for linear in (stacked, layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
        ]
        bindings = [binding(linear) for linear in linears]
        norms = _norms(model)
        covered = all(type(norm).__name__ in NORMS for norm in norms) and all(
            not hasattr(layer.self_attn, "q_norm") and type(layer.mlp.act_fn).__name__ in ACTIVATIONS
            for layer in layers
        )
        one_eps = len({float(norm.variance_epsilon) for norm in norms}) == 1 if covered else False
        if None in bindings or not one_eps or compiled(_causal) is None:
            return None
        return cls(model, heads, scale, linears, bindings, compiled(_causal))

    def __call__(self, ids, positions, rotary: tuple[torch.Tensor, torch.Tensor], slots) -> torch.Tensor:
        """Final hidden states [W, D] of ids [W] at `positions`, the rows of `slots` (fixed_shape.RowSlot:
        any requests, padding anywhere); rotary: the cos and sin tables [slots, D_h]; writes the real
        rows' keys and values."""
        layout = CallLayout.of(slots)
        with torch.jit.optimized_execution(False):
            return self.graph(
                ids, positions, layout.rows, layout.runs, self.embedding, rotary[0], rotary[1], self.norms,
                self.eps, self.linears, self.heads, self.scale, layout.tensors("keys"), layout.tensors("values"),
                TINY, float(QMAX),
            )  # fmt: skip


def _norms(model: Any) -> list[Any]:
    """Every RMSNorm of the model in the graph's order: each layer's two, then the last."""
    pairs = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in model.layers]
    return [norm for pair in pairs for norm in pair] + [model.norm]
