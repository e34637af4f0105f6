"""oneDNN's int8 inner product on weights packed once, at load, into its own blocked layout.

`torch._int_mm` takes a plain [K, N] weight in every call. For Whisper's 51,865 x 512 output
projection at 8 rows the packed weight is about twice as fast: 3.1 ms hot and 5.0 ms with cold
caches against 1.4 / 2.5 ms (Xeon, one thread, capped to AVX512_CORE_VNNI; 3.3 / 5.4 against
1.4 / 2.5 uncapped with AMX). Under AVX2 alone the packed kernel is slower (18.6 against 6.9 ms),
and at 512 x 512 its fixed cost loses everywhere; so it is one more layout that
`int8_linear.measured_layout` times per shape, not a default. A packed linear keeps its plain
int8 weight too (a copy packs again from it): the projection's weight is held twice.

The integers are the same. The signed input row is shifted by 128 into uint8 with zero point
128, the weight is int8 with unit scale and zero point 0, the output fp32 with scales of 1.0.
oneDNN sums the shifted products and subtracts 128 times the weight column's sum *after*
converting to fp32 (seen here: at K = 2048 a shifted sum of 33,070,419 came out 1 off). So the
depth is cut into chunks whose shifted sums all stay below 2^24, where fp32 holds every integer:
depth * 255 * weight range <= 2^24, i.e. chunks of 512 with 8-bit weights and 1024 with 7-bit
ones (Whisper base's and tiny's output projections, K = 512 and 384, are one chunk). Each chunk's
sum is then exact in fp32; the chunks are added in int32, exact, and converted once: bitwise
`torch._int_mm(...).float()`. `int8_linear.products_exact` also checks the kernel on this CPU at
every shape in use, like the other layouts; where it is not exact it is never offered.
Measured on Qwen2.5-Coder's 151,936-row projections at 8 rows, cold (same Xeon, one thread):
K = 896 28.0 -> 18.7 ms, K = 1536 47.3 -> 29.2 ms (capped: 28.1 -> 22.5, 44.3 -> 34.8).
"""

from __future__ import annotations

import copy

import torch

SHIFT = 128  # int8 in [-127, 127] -> uint8 in [1, 255], zero point 128
FP32_EXACT = 1 << 24  # every integer up to this is an fp32


def chunk_depth(weight_max: int) -> int:
    """The deepest chunk, a multiple of 64, whose shifted sums are all fp32 (512 for 8-bit weights)."""
    return FP32_EXACT // ((127 + SHIFT) * weight_max) // 64 * 64


def _ops():
    """oneDNN's (prepack, run) in this torch build, or None (a build without oneDNN's int8 ops)."""
    try:
        return torch.ops.onednn.qlinear_prepack, torch.ops.onednn.qlinear_pointwise
    except (AttributeError, RuntimeError):
        return None


def available() -> bool:
    return _ops() is not None


class PackedProducts:
    """int8 [M, K] inputs -> fp32 [M, N] exact sums, for one int8 weight [N, K] whose magnitudes
    are at most `weight_max`, packed in chunks of `depth` (by default the deepest exact one)."""

    def __init__(self, quantized: torch.Tensor, rows_hint: int, weight_max: int, depth: int | None = None):
        ops = _ops()
        if ops is None:
            raise RuntimeError("this torch build has no oneDNN int8 inner product")
        prepack, self._run = ops
        self.quantized, self.rows_hint, self.weight_max = quantized, rows_hint, weight_max  # a copy re-packs
        self.depth = depth or chunk_depth(weight_max)
        k = quantized.shape[1]
        self.bounds = [(start, min(start + self.depth, k)) for start in range(0, k, self.depth)]
        self.weights = [prepack(quantized[:, a:b].contiguous(), [rows_hint, b - a]) for a, b in self.bounds]
        columns = quantized.shape[0]
        self.unit_scales = torch.ones(columns)
        self.zero_points = torch.zeros(columns, dtype=torch.long)

    def __call__(self, x_q: torch.Tensor) -> torch.Tensor:
        shifted = (x_q.to(torch.int16) + SHIFT).to(torch.uint8)
        if len(self.bounds) == 1:
            return self._chunk(shifted, self.weights[0])
        total = None
        for (start, end), weight in zip(self.bounds, self.weights, strict=True):
            part = self._chunk(shifted[:, start:end].contiguous(), weight).to(torch.int32)  # exact integers
            total = part if total is None else total.add_(part)
        return total.float()

    def _chunk(self, shifted: torch.Tensor, weight) -> torch.Tensor:
        return self._run(
            shifted, 1.0, SHIFT, weight, self.unit_scales, self.zero_points,
            None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip

    def __deepcopy__(self, memo) -> PackedProducts:
        # oneDNN's packed tensors cannot be copied; the copy packs its own from the int8 weight
        return PackedProducts(copy.deepcopy(self.quantized, memo), self.rows_hint, self.weight_max, self.depth)
