"""FBGEMM's int8 GEMM (inside every x86 torch build) on weights packed once, at load.

On an AVX2-only CPU torch._int_mm has no fast path: on a 2-core AMD EPYC 7002 "Zen 2" (no
AVX-512, no VNNI, no bf16; one thread, 8 rows) Whisper base's 51,865 x 512 output projection took
194 ms in `_int_mm` and 39.5 ms in fp32, and FBGEMM 6.4 ms; its 2048 x 512 linear 7.6 / 0.73 /
0.26 ms. FBGEMM is what PyTorch's own quantized linears run on x86, written for few rows.

The integers are the same as `_int_mm`'s. The signed input row is passed as fp32 integer values
with scale 1.0 and zero point 128 (FBGEMM's input is unsigned), so its quantization step is
exact (x + 128 in [1, 255]); the weight is int8 with unit scale and zero point 0 (its own
per-channel scales are applied after, in fp32). FBGEMM sums the shifted products in int32,
subtracts 128 times the column sum in int32, and converts each sum once to fp32 (times 1.0):
bitwise `torch._int_mm(...).float()`. Without VNNI it adds u8 x s8 products in saturating int16
pairs, like oneDNN's AVX2 path, so there the weights use 7 bits (int8_linear.weight_range).
`int8_linear.products_exact` checks it on this CPU at every depth in use; where it is not exact
it is never offered.

The operand without zero point: `zero_point=0` takes a non-negative input as it is (the
cross-attention weights' digits, int8_attention.py), so u8 x s8 pairs stay within int16 for
full-range weights (2 * 63 * 127).
"""

from __future__ import annotations

import copy
import threading
import warnings

import torch

from asyncspec.models.int8_packed import SHIFT  # int8 in [-127, 127] -> uint8 in [1, 255], as oneDNN's

_ENGINE_LOCK = threading.Lock()  # the prepack reads torch's process-wide quantized engine


def available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


class FbgemmProducts:
    """int8 (or integer-valued fp32) [M, K] inputs -> fp32 [M, N] exact sums, for one int8
    weight [N, K] packed by FBGEMM. `zero_point`: SHIFT for signed inputs, 0 for inputs >= 0."""

    def __init__(self, quantized: torch.Tensor, zero_point: int = SHIFT):
        if not available():
            raise RuntimeError("this torch build has no FBGEMM")
        self.quantized, self.zero_point = quantized, zero_point  # a copy re-packs
        with warnings.catch_warnings():  # quantized tensors are deprecated as a user API, not the kernels
            warnings.simplefilter("ignore")
            # one unit scale for the whole weight: the same integers as a unit scale per channel,
            # but FBGEMM's prepack reads a per-channel scale row by row in Python-visible ops
            # (Whisper base's 51,865-row output projection: 522 ms per process, 350 ms so)
            weight = torch._make_per_tensor_quantized_tensor(quantized.contiguous(), 1.0, 0)
            with _ENGINE_LOCK:
                engine = torch.backends.quantized.engine
                torch.backends.quantized.engine = "fbgemm"
                try:
                    self.packed = torch.ops.quantized.linear_prepack(weight, None)
                finally:
                    torch.backends.quantized.engine = engine

    def __call__(self, x_q: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            x_q if x_q.dtype == torch.float32 else x_q.float(), 1.0, self.zero_point, self.packed
        )

    def __deepcopy__(self, memo) -> FbgemmProducts:
        # packed parameters are not copied; the copy packs its own from the int8 weight
        return FbgemmProducts(copy.deepcopy(self.quantized, memo), self.zero_point)
