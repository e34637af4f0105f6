"""Which of int8's two roundings moves the word error rate: a diagnostic, not an engine.

Put this folder first on PYTHONPATH and set INT8_VARIANT; every Python process then started
(`asyncspec bench e2e` times each system in its own) replaces the int8 linears' arithmetic:

- act_fp32: int8 weights, activations not quantized (fp32 products of the dequantized weights);
- act16: activations in two int8 parts (about 14 bits), products still exact int32 sums;
- w_fp32: activations quantized per row as the engine does, weights left in fp32.

    PYTHONPATH=scripts/int8_error_sources INT8_VARIANT=act16 asyncspec bench e2e \\
        --systems target --dtype int8 --encoder fp32 --no-cold --out /tmp/act16

Results and what they showed: docs/int8.md, section "Quality". Only act16 keeps the engine's
row-invariance; the other two use float products and are not exact across call widths.
"""

import os

VARIANT = os.environ.get("INT8_VARIANT")

if VARIANT:
    import torch

    from asyncspec.models import forward_whisper, int8_linear, scripted_step

    PARTS = 127  # act16: x_q = hi * 127 + lo, |hi| <= 127, |lo| <= 63

    def dequantized_weight(linear) -> torch.Tensor:
        weight = linear.weight_q.t() if linear.layout == "kn" else linear.weight_q
        return weight.float() * linear.weight_scale.reshape(-1, 1)

    def two_part_products(linear, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().amax(dim=1, keepdim=True).clamp(min=int8_linear.TINY) / (PARTS * PARTS)
        q = torch.round(x / scale).clamp(-PARTS * PARTS, PARTS * PARTS)
        high = torch.round(q / PARTS)
        low = q - high * PARTS
        weight = linear.weight_q.t()  # act16 builds every linear in the "nk" layout
        sums = torch._int_mm(high.to(torch.int8), weight).float() * PARTS
        sums = sums + torch._int_mm(low.to(torch.int8), weight).float()
        return sums * scale * linear.weight_scale

    def variant_output(linear, x: torch.Tensor) -> torch.Tensor:
        if VARIANT == "act_fp32":
            return x @ dequantized_weight(linear).t()
        if VARIANT == "act16":
            return two_part_products(linear, x)
        if VARIANT == "w_fp32":
            x_q, scale = int8_linear.quantize_rows(x)
            return (x_q.float() * scale) @ linear.fp32_weight.t()
        raise SystemExit(f"INT8_VARIANT: unknown variant {VARIANT!r} (act_fp32, act16 or w_fp32)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leading = x.shape[:-1]
        y = variant_output(self, x.reshape(-1, self.in_features).float())
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*leading, self.out_features)

    engine_init = int8_linear.Int8Linear.__init__

    def init_keeping_fp32(self, weight, bias, layout=None, kept=None):
        engine_init(self, weight, bias, layout="nk" if VARIANT == "act16" else layout, kept=kept)
        self.fp32_weight = weight.detach().float().clone()

    def each_applied(linears, x):  # no shared quantization: every linear goes through forward
        return [linear(x) for linear in linears]

    def kept_apart(self, linears):  # no stacked q|k|v linear: each goes through forward
        self.linears, self.widths, self.stacked = linears, [linear.out_features for linear in linears], None

    int8_linear.Int8Linear.__init__ = init_keeping_fp32  # type: ignore[method-assign]
    int8_linear.Int8Linear.forward = forward  # type: ignore[method-assign]
    forward_whisper.shared_input = int8_linear.shared_input = each_applied
    int8_linear.SideBySide.__init__ = kept_apart  # type: ignore[method-assign]
    # the scripted decoding call computes the engine's own arithmetic: the eager forward runs instead
    scripted_step.ScriptedWhisperStep.build = classmethod(lambda cls, *args: None)  # type: ignore[method-assign,assignment]
