"""The int8 Whisper decoder's decoding call as one TorchScript graph: the same
operators, in the same order, on the same tensors as the eager forward (forward_whisper.py,
int8_linear.py, int8_attention.py, fixed_shape.attend_causal), so the same bits, without Python
between them.

Why: a one-row call of whisper-base int8 runs about 1,100 small operators (per-row quantization,
scales, attention row by row), and in eager torch each costs Python and dispatch time beside its
arithmetic. On a 2-core Zen 2 (AVX2 only, two threads) a whole one-row call, output projection
included, took 12.4 ms eager and 7.9 ms with this graph (8 rows: 23.3 and 16.2 ms), bitwise
equal; CTranslate2's step takes 8.7 ms there. The graph runs on TorchScript's plain interpreter
(`torch.jit.optimized_execution(False)`): no profiling, no graph passes, no fuser, so each node
calls the aten kernel eager torch calls, on the same tensors (and it was faster than the
optimizing executor: 8.7 ms).

Which calls: every decoding call no wider than the cross-attention block, its rows of any
requests over one encoder output (a window's fallback draws decode side by side) with padding
anywhere, none of them keeping an attention record (word timestamps), with every linear of the
layers FBGEMM's or `torch._int_mm`'s (oneDNN's packed kernel has no TorchScript binding). Any
other call (a prompt block, stacked blocks, a recorded call) runs eagerly. `torch.jit` is
deprecated in favour of `torch.compile`, which generates its own kernels: exactly what this must
not do. Where scripting fails the eager forward runs, giving the same bits.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from asyncspec.models import int8_fbgemm
from asyncspec.models.fixed_shape import consecutive_runs
from asyncspec.models.int8_attention import QuantizedKeys, QuantizedValues, weight_digits
from asyncspec.models.int8_fbgemm import FbgemmProducts
from asyncspec.models.int8_linear import QMAX, TINY, Int8Linear, weight_range

# A linear's kernel inside the graph (TorchScript reads no module constant: the graph spells them
# 0 and 1): FBGEMM on fp32 codes, or torch._int_mm on int8 codes
FBGEMM, INT_MM = 0, 1
# (kind, FBGEMM's packing, torch._int_mm's [K, N] operand, FBGEMM's zero point, weight scale, bias)
Linear = tuple[
    int,
    torch.classes.quantized.LinearPackedParamsBase,  # type: ignore[name-defined]
    torch.Tensor,
    int,
    torch.Tensor,
    torch.Tensor | None,
]


def linear_step(x: torch.Tensor, linear: Linear, tiny: float, qmax: float) -> torch.Tensor:
    """Int8Linear.forward: quantize_rows, the integer products, the two scales, the bias."""
    kind, packed, operand, zero_point, weight_scale, bias = linear
    scale = x.abs().amax(dim=1, keepdim=True).clamp_(min=tiny).div_(qmax)
    levels = torch.div(x, scale).round_()
    if kind == 0:  # FBGEMM
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(levels, 1.0, zero_point, packed)
    else:
        y = torch._int_mm(levels.to(torch.int8), operand).float()
    y = y.mul_(scale).mul_(weight_scale)
    if bias is not None:
        y = y.add_(bias)
    return y


def write_runs(tensors: list[torch.Tensor], base: int, rows: torch.Tensor, runs: list[tuple[int, int, int, int]]):
    """fixed_shape.write_rows: each run (first row, rows, cache, start) of rows [H_kv, W, D_h] into
    tensors[base + cache] at its positions start, start + 1, ... (one slice copy per run)."""
    for first, count, cache, start in runs:
        tensors[base + cache][:, start : start + count] = rows[:, first : first + count]


def self_attention(
    queries: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    base: int,
    rows: list[tuple[int, int, int]],
    scale: float,
) -> torch.Tensor:
    """fixed_shape.attend_causal: queries [H, W, D_h]; each real row (row, cache, position) attends
    over keys/values[base + cache] [H_kv, slots, D_h] up to its position (grouped-query heads share
    theirs); other rows (padding) are zeros."""
    heads, width, head_dim = queries.shape
    out = torch.zeros(width, heads * head_dim, dtype=torch.float32)
    for row, cache, position in rows:
        visible, kv_heads = position + 1, keys[base + cache].shape[0]
        q = queries[:, row].to(torch.float32, copy=True).view(kv_heads, heads // kv_heads, head_dim)
        scores = torch.matmul(q, keys[base + cache][:, :visible].transpose(1, 2))
        weights = torch.softmax(scores * scale if scale != 1.0 else scores, dim=-1)
        out[row] = torch.matmul(weights, values[base + cache][:, :visible]).reshape(-1)
    return out


def _cross_attention(
    queries: torch.Tensor,
    key_codes: torch.Tensor,
    key_scales: torch.Tensor,
    value_codes: torch.Tensor,
    value_scales: torch.Tensor,
    base: int,
    tiny: float,
    qmax: float,
) -> torch.Tensor:
    """fixed_shape.attend_all with int8_attention.integer_scores and integer_weighted_sum."""
    heads, rows, head_dim = queries.shape
    flat = queries.reshape(heads * rows, head_dim)
    row_scales = flat.abs().amax(dim=1, keepdim=True).clamp_(min=tiny).div_(qmax)
    codes = torch.div(flat, row_scales).round_()
    if key_codes.dtype == torch.float32:
        sums = torch.matmul(codes.view(heads, rows, head_dim), key_codes)
    else:
        int8_codes = codes.to(torch.int8).view(heads, rows, head_dim)
        sums = torch.empty((heads, rows, key_codes.shape[2]), dtype=torch.int32)
        for head in range(heads):
            torch._int_mm(int8_codes[head], key_codes[head], out=sums[head])
    scores = torch.mul(sums, row_scales.view(heads, rows, 1)).mul_(key_scales)
    weights = torch.softmax(scores, dim=-1)
    digits, scales = weight_digits(weights, base, tiny, value_codes.dtype)
    if value_codes.dtype == torch.float32:
        weighted = torch.matmul(value_codes, digits.transpose(1, 2))
    else:
        weighted = torch.empty((heads, value_codes.shape[1], 2 * rows), dtype=torch.int32)
        for head in range(heads):
            torch._int_mm(value_codes[head], digits[head].t(), out=weighted[head])
    out = torch.mul(weighted[:, :, :rows], float(base)).add_(weighted[:, :, rows:])
    out = out.mul_(scales.transpose(1, 2)).mul_(value_scales).transpose(1, 2)
    return out.reshape(heads, rows, head_dim).transpose(0, 1).reshape(rows, heads * head_dim)


def _decoder(
    ids: torch.Tensor,
    positions: torch.Tensor,
    rows: list[tuple[int, int, int]],
    runs: list[tuple[int, int, int, int]],
    embedding: torch.Tensor,
    embed_scale: float,
    position_table: torch.Tensor,
    norms: list[torch.Tensor],
    eps: float,
    linears: list[Linear],
    scaling: float,
    heads: int,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    cross: list[torch.Tensor],
    base: int,
    tiny: float,
    qmax: float,
) -> torch.Tensor:
    """forward_whisper.WhisperBlockForward.__call__ for one cross-attention block: final hidden states.
    keys/values: every layer's cache tensor of each request in the call, layer by layer."""
    width, layers = ids.shape[0], len(linears) // 6
    x = torch.embedding(embedding, ids) * embed_scale
    x = x + position_table[positions]
    size = x.shape[1]
    head_dim = size // heads
    caches = len(keys) // layers
    for layer in range(layers):
        # a layer's 6 linears (q|k|v, self out, cross q, cross out, fc1, fc2) and its 3 norms' 6 tensors
        n, kv = 6 * layer, caches * layer  # kv: this layer's first cache tensor
        h = torch.layer_norm(x, [size], norms[n], norms[n + 1], eps)
        q, k, v = linear_step(h, linears[n], tiny, qmax).split([size, size, size], dim=-1)
        queries = (q * scaling).view(width, heads, head_dim).transpose(0, 1)
        write_runs(keys, kv, k.view(width, heads, head_dim).transpose(0, 1), runs)
        write_runs(values, kv, v.view(width, heads, head_dim).transpose(0, 1), runs)
        attended = self_attention(queries, keys, values, kv, rows, 1.0)
        x = x + linear_step(attended, linears[n + 1], tiny, qmax)
        h = torch.layer_norm(x, [size], norms[n + 2], norms[n + 3], eps)
        q = linear_step(h, linears[n + 2], tiny, qmax)
        cross_queries = (q * scaling).view(width, heads, head_dim).transpose(0, 1).reshape(heads, width, head_dim)
        c = 4 * layer
        attended = _cross_attention(cross_queries, cross[c], cross[c + 1], cross[c + 2], cross[c + 3], base, tiny, qmax)
        x = x + linear_step(attended, linears[n + 3], tiny, qmax)
        h = torch.layer_norm(x, [size], norms[n + 4], norms[n + 5], eps)
        hidden = torch.nn.functional.gelu(linear_step(h, linears[n + 4], tiny, qmax))
        x = x + linear_step(hidden, linears[n + 5], tiny, qmax)
    last = 6 * layers  # the final norm's weight and bias
    return torch.layer_norm(x, [size], norms[last], norms[last + 1], eps)


_SCRIPTED: dict[Any, Any] = {}  # function -> its compiled graph, once per process; None where it failed


def compiled(function: Any) -> Any:
    """`function` compiled by TorchScript, or None where this torch cannot (the eager forward runs)."""
    if function not in _SCRIPTED:
        try:
            with warnings.catch_warnings():  # deprecated for torch.compile, which must not be used here
                warnings.simplefilter("ignore", DeprecationWarning)
                _SCRIPTED[function] = torch.jit.script(function)
        except Exception:  # noqa: BLE001 - any failure to compile leaves the eager forward, same bits
            _SCRIPTED[function] = None
    return _SCRIPTED[function]


class ScriptedWhisperStep:
    """The scripted decoding call of one int8 Whisper decoder, over its modules' own tensors (built
    after its linears were replaced by Int8Linear). `build` returns None where a linear's kernel
    has no binding here or the graph does not compile: the eager forward runs."""

    def __init__(self, decoder: Any, heads: int, linears: list[Int8Linear], bindings: list[tuple], graph: Any):
        self.graph, self.heads = graph, heads
        self.embedding, self.embed_scale = decoder.embed_tokens.weight, float(decoder.embed_scale)
        self.position_table = decoder.embed_positions.weight
        self.norms = [tensor for norm in _norms(decoder) for tensor in (norm.weight, norm.bias)]
        self.eps = float(decoder.layer_norm.eps)
        self.scaling = float(decoder.layers[0].self_attn.scaling)
        self.linears = graph_linears(linears, bindings)
        self.base = weight_range() + 1  # the weighted sum's digits, as int8_attention's

    @classmethod
    def build(cls, decoder: Any, heads: int, stacked_projections: list[Any]) -> ScriptedWhisperStep | None:
        """stacked_projections: each layer's q|k|v linear (Int8Linear.side_by_side), or None."""
        linears = [
            linear
            for layer, stacked in zip(decoder.layers, stacked_projections, strict=True)
            for linear in (stacked, *_other_linears(layer))
        ]
        bindings = [binding(linear) for linear in linears]
        attentions = [attention for layer in decoder.layers for attention in (layer.self_attn, layer.encoder_attn)]
        one_eps = len({float(norm.eps) for norm in _norms(decoder)}) == 1
        one_scaling = len({float(attention.scaling) for attention in attentions}) == 1
        if None in bindings or not (one_eps and one_scaling) or compiled(_decoder) is None:
            return None
        return cls(decoder, heads, linears, bindings, compiled(_decoder))

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, slots: Sequence[Any]) -> torch.Tensor:
        """Final hidden states [W, D] of ids [W] at `positions`, the rows of `slots` (fixed_shape.RowSlot:
        any requests over one encoder output, padding anywhere); writes the real rows' keys and values."""
        layout = CallLayout.of(slots)
        memory = slots[0].cache.cross  # every request of the call shares it (checked by the caller)
        cross = [t for keys, values in memory for t in (keys.codes, keys.scales, values.codes, values.scales)]
        with torch.jit.optimized_execution(False):
            return self.graph(
                ids, positions, layout.rows, layout.runs, self.embedding, self.embed_scale, self.position_table,
                self.norms, self.eps, self.linears, self.scaling, self.heads, layout.tensors("keys"),
                layout.tensors("values"), cross, self.base, TINY, float(QMAX),
            )  # fmt: skip


class CallLayout:
    """A call's rows as the graphs read them: the requests' caches in order of first appearance;
    (row, cache, position) of every real row; (first row, rows, cache, start) of every run of real
    rows at consecutive positions of one cache (one slice copy each, as fixed_shape.write_rows)."""

    def __init__(self, caches: list[Any], rows: list[tuple[int, int, int]], runs: list[tuple[int, int, int, int]]):
        self.caches, self.rows, self.runs = caches, rows, runs

    @classmethod
    def of(cls, slots: Sequence[Any]) -> CallLayout:
        caches: list[Any] = []
        rows = []
        for row, slot in enumerate(slots):
            if not slot.real:
                continue
            index = next((index for index, cache in enumerate(caches) if cache is slot.cache), len(caches))
            if index == len(caches):
                caches.append(slot.cache)
            rows.append((row, index, slot.position))
        cache_of = {row: cache for row, cache, _ in rows}
        first_layer = [slot.cache.keys[0] for slot in slots]
        runs = [
            (first, count, cache_of[first], slots[first].position)
            for first, count in consecutive_runs(first_layer, slots)
        ]
        return cls(caches, rows, runs)

    def tensors(self, kind: str) -> list[torch.Tensor]:
        """Every layer's cache tensor of `kind` (keys or values) of each request, layer by layer."""
        per_cache = [getattr(cache, kind) for cache in self.caches]
        return [tensors[layer] for layer in range(len(per_cache[0])) for tensors in per_cache]


def scriptable_cross(cross: list) -> bool:
    """Does a cache's cross-attention memory hold the int8 engine's quantized keys and values?"""
    return bool(cross) and isinstance(cross[0][0], QuantizedKeys) and isinstance(cross[0][1], QuantizedValues)


def _norms(decoder: Any) -> list[Any]:
    """Every layer norm of the decoder, in the graph's order: each layer's three, then the last."""
    layers = decoder.layers
    per_layer = [
        (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm) for layer in layers
    ]
    return [norm for norms in per_layer for norm in norms] + [decoder.layer_norm]


def _other_linears(layer: Any) -> tuple[Any, ...]:
    """A layer's linears after its stacked q|k|v, in the graph's order."""
    return layer.self_attn.out_proj, layer.encoder_attn.q_proj, layer.encoder_attn.out_proj, layer.fc1, layer.fc2


def graph_linears(linears: list[Int8Linear], bindings: list[tuple]) -> list[Linear]:
    """Each linear as the graph reads it: its binding, then its weight scale and bias."""
    return [(*bound, linear.weight_scale, linear.bias) for linear, bound in zip(linears, bindings, strict=True)]


_PLACEHOLDERS: list[Any] = []  # an FBGEMM packing in the slots of linears that use torch._int_mm


def binding(linear: Any) -> tuple[int, Any, torch.Tensor, int] | None:
    """(kind, FBGEMM packing, torch._int_mm's [K, N] operand, zero point) of an Int8Linear, each
    unused slot a placeholder; None for another module or kernel (oneDNN's packing)."""
    if not isinstance(linear, Int8Linear) or not int8_fbgemm.available():  # no placeholder packing
        return None
    if isinstance(linear.prepacked, FbgemmProducts):
        return FBGEMM, linear.prepacked.packed, torch.empty(0, dtype=torch.int8), linear.prepacked.zero_point
    if linear.prepacked is not None:
        return None
    if not _PLACEHOLDERS:
        _PLACEHOLDERS.append(FbgemmProducts(torch.ones(1, 1, dtype=torch.int8)).packed)
    operand = linear.weight_q if linear.layout == "kn" else linear.weight_q.t()
    return INT_MM, _PLACEHOLDERS[0], operand, 0
