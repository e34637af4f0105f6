"""`--dtype auto`: the target decoder's precision, int8, bf16 or fp32, chosen by measurement on this CPU.

Attention, norms and softmax run in fp32 in all three (models/fixed_shape.py), so they differ in
the linears alone: the decoder's layer shapes and the output projection at the decoding width.
Those are timed here on random weights of the model's shapes (the model itself is loaded once,
in the chosen precision). bf16 wins where the CPU has native bf16 and slow int8 paths; int8
wins where bf16 is emulated (a CPU without avx512_bf16 or AMX) and VNNI makes integer products
fast, and here on an AMD EPYC with both; on an AVX2-only CPU too since FBGEMM is a layout (Zen 2,
Whisper base: int8 16.0 ms, fp32 48.3 ms, bf16 117.6 ms a call's linears), where before only
torch._int_mm's slow path was there and fp32 won (Zen 1: fp32 67 ms, bf16 86 ms, int8 228 ms). int8
is a candidate only if its integer products are exact on this CPU. The choice is cached per
machine (CPU model and flags, ISA caps, torch version, threads, shapes).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from asyncspec.models.cache_entries import entry_path, keep_first
from asyncspec.models.int8_linear import TIMING_ROWS, Int8Linear, products_exact
from asyncspec.models.threads import openmp_settings

REPEATS = 5
# Bumped when the candidates' kernels change, so a choice cached before is timed again (2: FBGEMM's
# int8 linears, the fast int8 path of an AVX2-only CPU)
KERNELS_REVISION = 2
ROUNDS = 3  # candidates timed in turn, this many times: a stall during one pass cannot decide


@dataclass(frozen=True)
class PrecisionChoice:
    dtype: str  # "int8", "bf16" or "fp32"
    measured_ms: dict[str, float]  # candidate -> ms of one call's linears at the decoding width
    int8_exact: bool
    cached: bool = False

    def summary(self) -> str:
        timings = ", ".join(f"{k} {v:.1f} ms" for k, v in self.measured_ms.items())
        why = "" if self.int8_exact else "; int8 products are not exact on this CPU"
        return f"dtype auto: {self.dtype} (one call's linears at {TIMING_ROWS} rows: {timings}{why})"


def linear_shapes(config: dict) -> list[tuple[int, int]]:
    """[N, K] of every linear one decoding call runs: the layers' and the output projection."""
    if config.get("model_type") == "whisper":
        d, ffn, layers = config["d_model"], config["decoder_ffn_dim"], config["decoder_layers"]
        per_layer = [(d, d)] * 6 + [(ffn, d), (d, ffn)]  # self q k v out, cross q out, MLP
    else:
        d, ffn, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or d // heads
        kv = config.get("num_key_value_heads", heads) * head_dim
        per_layer = [(heads * head_dim, d), (kv, d), (kv, d), (d, heads * head_dim), (ffn, d), (ffn, d), (d, ffn)]
    return per_layer * layers + [(config["vocab_size"], d)]


@torch.inference_mode()
def time_linears(shapes: list[tuple[int, int]]) -> dict[str, float]:
    """ms of one pass over every shape at the decoding width, per candidate (median of REPEATS)."""
    generator = torch.Generator().manual_seed(0)
    distinct = sorted(set(shapes))
    weights = {shape: torch.randn(*shape, generator=generator) * 0.02 for shape in distinct}
    count = {shape: shapes.count(shape) for shape in distinct}
    candidates = {
        "int8": {shape: Int8Linear(w, None) for shape, w in weights.items()},
        "bf16": {shape: _bf16_linear(w) for shape, w in weights.items()},
        "fp32": {shape: _fp32_linear(w) for shape, w in weights.items()},
    }
    inputs = {shape: torch.randn(TIMING_ROWS, shape[1], generator=generator) for shape in distinct}
    for layers in candidates.values():
        for shape, layer in layers.items():
            layer(inputs[shape])  # warm-up: the kernel is chosen on the first call
    rounds: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(ROUNDS):
        for name, layers in candidates.items():
            timed = (median_seconds(layer, inputs[shape]) * count[shape] for shape, layer in layers.items())
            rounds[name].append(sum(timed))
    return {name: round(1000 * min(totals), 2) for name, totals in rounds.items()}


def median_seconds(layer, x: torch.Tensor) -> float:
    """The median of REPEATS timed calls `layer(x)` (warmed up by the caller)."""
    passes = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        layer(x)
        passes.append(time.perf_counter() - start)
    return sorted(passes)[REPEATS // 2]


def _bf16_linear(weight: torch.Tensor):
    weight = weight.to(torch.bfloat16)
    return lambda x: torch.nn.functional.linear(x.to(torch.bfloat16), weight)


def _fp32_linear(weight: torch.Tensor):
    return lambda x: torch.nn.functional.linear(x, weight)


def choose_precision(model_dir: str | Path) -> PrecisionChoice:
    """The fastest of int8, bf16 and fp32 for the model in `model_dir` on this machine (cached)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    shapes = linear_shapes(config)
    path = _cache_file(shapes)
    cached = _read(path)
    if cached is not None:
        return cached
    exact = all(products_exact(k, n) for n, k in sorted(set(shapes)))
    timings = time_linears(shapes)
    eligible = {name: ms for name, ms in timings.items() if exact or name != "int8"}
    dtype = min(eligible, key=eligible.get)  # ties: the first listed (int8, bf16, fp32)
    measured = asdict(PrecisionChoice(dtype, timings, exact))
    standing = keep_first(path, measured)  # another process's choice if it wrote first
    return PrecisionChoice(**{**standing, "cached": standing is not measured})


def _cache_file(shapes: list[tuple[int, int]]) -> Path:
    from asyncspec.models.selftest import machine_identity

    key = {"shapes": shapes, "openmp": openmp_settings(), "kernels": KERNELS_REVISION}
    return entry_path("precision", machine_identity() | key)


def _read(path: Path) -> PrecisionChoice | None:
    if not path.is_file():
        return None
    try:
        return PrecisionChoice(**{**json.loads(path.read_text()), "cached": True})
    except (ValueError, TypeError):
        return None  # a damaged entry is measured again
