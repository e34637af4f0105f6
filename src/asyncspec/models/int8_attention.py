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

The weights stay fp32 (softmax per row), and the weighted sum of the values stays attend_all's
float product: rounding the weights to 8 bits per row would drop a peaked row's tail, which can
carry a tenth of its mass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncspec.models.int8_linear import quantize_rows, weight_range


@dataclass(frozen=True)
class QuantizedKeys:
    """One layer's cross-attention keys: int8 codes [H_kv, D_h, T] (each key a column, for
    torch._int_mm's [K, N] operand) and each key's scale, fp32 [H_kv, 1, T]."""

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
    return QuantizedKeys(
        codes.view(heads, frames, head_dim).transpose(1, 2).contiguous(), scales.view(heads, 1, frames)
    )


def integer_scores(queries: torch.Tensor, keys: QuantizedKeys) -> torch.Tensor:
    """queries fp32 [H_kv, R, D_h] -> scores fp32 [H_kv, R, T] (up to the per-row constant that the
    keys' centring removed)."""
    heads, rows, head_dim = queries.shape
    codes, row_scales = quantize_rows(queries.reshape(heads * rows, head_dim))
    codes = codes.view(heads, rows, head_dim)
    sums = torch.empty((heads, rows, keys.codes.shape[2]), dtype=torch.int32)
    for head in range(heads):
        torch._int_mm(codes[head], keys.codes[head], out=sums[head])
    scores = sums.float() * row_scales.view(heads, rows, 1)
    return scores * keys.scales
