"""Cross-attention scores in integers, for the int8 engine: a call's scores are exact by
construction at any width, and four times less memory is streamed per call.

Every decoding call attends over the same 1,500 encoder frames per head. In float, that product is
the largest part of a Whisper base call (two threads, capped to AVX-512 VNNI, Zen 4: 4.7 of
17.9 ms), and its bits are a row's own only because attend_all puts the rows in a GEMM's columns,
which holds on the kernels measured, not by construction. Here each step is a function of the row
(or of the key) alone:

- the keys are centred per head over the frames, then each key quantized by its own absmax, once
  per window. Centring subtracts q·mean from every score of a query row, and softmax is unchanged
  by a constant per row; it takes the offset all of a head's keys share out of each key's range;
- a query row (one head's D_h values) is quantized by its own absmax (int8_linear.quantize_rows);
- int8 x int8 products are summed in int32, exact in any order (|sum| <= 64 * 127 * 127);
- the sums are scaled by the row's and then the key's scale, each its own correctly rounded
  multiply per element.

The weights are computed in fp32 (softmax per row). Their sum over the values is in integers too
(`integer_weighted_sum`): in float it was the largest product of a call (Zen 4 capped to VNNI, one
thread: 0.4-0.6 ms a layer, the 3 MB of fp32 values streamed per layer), and it too was a row's own
only because its rows sat in a GEMM's columns.

- the values are quantized per channel over the frames (each channel of a head by its own absmax),
  once per window: the encoder output's alone, as a linear's weight per output channel;
- a row's weights are quantized by their own max to 14 bits, split into two 7-bit digits,
  hi * base + lo (two 6-bit digits, 12 bits, within a saturating AVX2 kernel's weight range):
  rounding them to one 8-bit digit would drop a peaked row's tail, which can carry a tenth of its
  mass;
- int8 x int8 sums of each digit in int32 (|sum| <= T * 127 * 127), then hi * base + lo and the
  two scales, one correctly rounded operation per element each.

Two kernels give those integers. `torch._int_mm`, or an fp32 product of the same integer codes:
where every sum is below 2^24 in magnitude, each partial sum is an integer fp32 holds exactly,
so any order, blocking or fused multiply-add gives the exact sum. That bound always holds for
the scores (64 * 127 * 127) and holds for the weighted sums with 7-bit digits (1,500 * 127 * 63
< 2^24), where the weights use 7 bits. On an AVX2-only CPU `_int_mm` has no fast path (Zen 2
EPYC, one thread, one head's scores at 8 rows: 0.71 ms against fp32's 0.08 ms), so the faster of
the two is measured once per process and shape; the integers, and so the bits, are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncspec.models.int8_linear import QMAX, TIMING_ROWS, TINY, quantize_rows, seconds_of_three, weight_range

FP32_EXACT = 1 << 24  # every integer up to this is an fp32
_FLOAT_FASTER: dict[tuple[int, int, int], bool] = {}  # (rows, depth, columns) -> measured once per process


def float_sums_exact(depth: int, a_max: int, b_max: int) -> bool:
    """Is every sum of `depth` products of integers within +-a_max and +-b_max an fp32 integer,
    and fp32 products computed as such (torch not told to trade precision for speed)?"""
    return depth * a_max * b_max < FP32_EXACT and torch.get_float32_matmul_precision() == "highest"


def float_products_faster(rows: int, depth: int, columns: int) -> bool:
    """Is an fp32 product [rows, depth] x [depth, columns] of integer codes faster here than
    torch._int_mm's? Measured once per process and shape (int8_linear.seconds_of_three)."""
    key = (rows, depth, columns)
    if key not in _FLOAT_FASTER:
        a, b = torch.ones(rows, depth, dtype=torch.int8), torch.ones(depth, columns, dtype=torch.int8)
        a_float, b_float = a.float(), b.float()
        float_seconds = seconds_of_three(lambda: torch.mm(a_float, b_float))
        _FLOAT_FASTER[key] = float_seconds < seconds_of_three(lambda: torch._int_mm(a, b))
    return _FLOAT_FASTER[key]


def _codes_dtype(exact_in_float: bool, rows: int, depth: int, columns: int) -> torch.dtype:
    """int8 for torch._int_mm, or fp32 (the same integers) where that product is exact and faster."""
    return torch.float32 if exact_in_float and float_products_faster(rows, depth, columns) else torch.int8


@dataclass(frozen=True)
class QuantizedKeys:
    """One layer's cross-attention keys: integer codes [H_kv, D_h, T] (each key a column, for
    torch._int_mm's [K, N] operand; int8, or fp32 for the float kernel) and each key's scale, fp32
    [H_kv, 1, T]."""

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """[H_kv, T, D_h], as the float keys it stands for."""
        heads, head_dim, frames = self.codes.shape
        return torch.Size((heads, frames, head_dim))

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.codes, self.scales


def quantize_keys(keys: torch.Tensor) -> QuantizedKeys:
    """keys fp32 [H_kv, T, D_h] -> QuantizedKeys. The key side takes the range whose products
    torch._int_mm sums exactly on this CPU (int8_linear.weight_range), as a linear's weight does."""
    heads, frames, head_dim = keys.shape
    centred = keys.float() - keys.float().mean(dim=1, keepdim=True)
    codes, scales = quantize_rows(centred.reshape(heads * frames, head_dim), weight_range())
    dtype = _codes_dtype(float_sums_exact(head_dim, QMAX, weight_range()), TIMING_ROWS, head_dim, frames)
    return QuantizedKeys(
        codes.view(heads, frames, head_dim).transpose(1, 2).to(dtype).contiguous(), scales.view(heads, 1, frames)
    )


def integer_scores(queries: torch.Tensor, keys: QuantizedKeys) -> torch.Tensor:
    """queries fp32 [H_kv, R, D_h] -> scores fp32 [H_kv, R, T] (up to the per-row constant that the
    keys' centring removed)."""
    heads, rows, head_dim = queries.shape
    codes, row_scales = quantize_rows(queries.reshape(heads * rows, head_dim), codes=keys.codes.dtype)
    codes = codes.view(heads, rows, head_dim)
    if keys.codes.dtype == torch.float32:  # exact: every sum an fp32 integer (quantize_keys)
        sums = torch.matmul(codes, keys.codes)
    else:
        sums = torch.empty((heads, rows, keys.codes.shape[2]), dtype=torch.int32)
        for head in range(heads):
            torch._int_mm(codes[head], keys.codes[head], out=sums[head])
    scores = torch.mul(sums, row_scales.view(heads, rows, 1))  # int32 x fp32: converted and multiplied in one pass
    return scores.mul_(keys.scales)


@dataclass(frozen=True)
class QuantizedValues:
    """One layer's cross-attention values: integer codes [H_kv, D_h, T] (each channel a row,
    torch._int_mm's [M, K] operand, so the full range: the saturating AVX2 kernel limits the other
    operand; int8, or fp32 for the float kernel) and each channel's scale, fp32 [H_kv, D_h, 1]."""

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """[H_kv, D_h, T], as the transposed float values it stands for."""
        return self.codes.shape

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.codes, self.scales


def quantize_values(values_t: torch.Tensor) -> QuantizedValues:
    """values fp32 [H_kv, D_h, T] -> QuantizedValues (each channel over the frames by its own absmax)."""
    heads, head_dim, frames = values_t.shape
    exact = float_sums_exact(frames, QMAX, weight_range())  # the weights' digits: at most weight_range
    dtype = _codes_dtype(exact, head_dim, frames, 2 * TIMING_ROWS)
    # each channel over the frames, its codes in the kernel's dtype at once: quantized to int8 and
    # converted after, 0.31-0.42 against 0.21-0.22 ms a layer (Zen 2, two threads)
    codes, scales = quantize_rows(values_t, QMAX, codes=dtype)
    return QuantizedValues(codes, scales)


def weight_digits(
    weights: torch.Tensor, base: int, tiny: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """weights fp32 [H_kv, R, T] (each row a softmax: >= 0) -> (digits [H_kv, 2R, T] in `dtype`: the
    rows' high digits, then their low ones; each row's scale fp32 [H_kv, R, 1]). Written straight
    into the digits' halves: computed apart and copied in, a 128-row prompt block's layer took
    1.30 against 0.88 ms (Zen 2, two threads). TorchScript compiles it into the decoding graph
    (scripted_step.py): one rule for both."""
    heads, rows, frames = weights.shape
    scales = weights.amax(dim=-1, keepdim=True).clamp_(min=tiny).div_(base * base - 1)
    levels = torch.div(weights, scales).round_()  # in [0, base^2 - 1], as quantize_rows' bound
    digits = torch.empty((heads, 2 * rows, frames), dtype=torch.float32)
    # exact: base is a power of two, the levels integers below 2^14
    high = torch.mul(levels, 1.0 / base, out=digits[:, :rows]).floor_()
    torch.sub(levels, high, alpha=base, out=digits[:, rows:])
    return digits.to(dtype), scales


def integer_weighted_sum(weights: torch.Tensor, values: QuantizedValues) -> torch.Tensor:
    """weights fp32 [H_kv, R, T] (each row a softmax: >= 0) -> sum_t w[r, t] v[t] fp32 [H_kv, R, D_h]."""
    heads, rows, _ = weights.shape
    base = weight_range() + 1  # each digit in [0, base - 1]: within the weight range of the B operand
    digits, scales = weight_digits(weights, base, TINY, values.codes.dtype)
    if values.codes.dtype == torch.float32:  # exact: every sum an fp32 integer (quantize_values)
        sums = torch.matmul(values.codes, digits.transpose(1, 2))
    else:
        sums = torch.empty((heads, values.codes.shape[1], 2 * rows), dtype=torch.int32)
        for head in range(heads):
            torch._int_mm(values.codes[head], digits[head].t(), out=sums[head])
    out = torch.mul(sums[:, :, :rows], float(base)).add_(sums[:, :, rows:])  # [H_kv, D_h, R]
    return out.mul_(scales.transpose(1, 2)).mul_(values.scales).transpose(1, 2)
