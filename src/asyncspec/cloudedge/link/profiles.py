"""Network profiles of the emulated edge–cloud link (seed 002 §V-A) and the link-scale factor.

Rates are TCP payload rates in Mbit/s (10^6 bit/s); uplink is edge -> cloud, downlink cloud -> edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from asyncspec.errors import InputError

# Seed 002 §V-A defines the profiles by bandwidth only and states no propagation delay. We use one
# one-way delay for all three so that, as in the paper, the profiles differ in bandwidth alone.
# 10 ms one way (20 ms RTT) is the order of a cellular access hop to a nearby cloud: Rohde & Schwarz
# measured 5G NR one-way latency between <7 ms (downlink, 100 kbit/s) and ~18 ms (uplink, 15 Mbit/s)
# in a public network (M. Kottkamp, "5G NR and LTE latency analysis in a public network", 2022).
DEFAULT_ONE_WAY_DELAY_MS = 10.0

# (uplink, downlink) Mbit/s, seed 002 §V-A.
PROFILE_RATES_MBIT: dict[str, tuple[float, float]] = {
    "weak": (50.0, 150.0),  # congested / LTE-like cellular access
    "medium": (150.0, 1000.0),  # sub-6 GHz 5G
    "strong": (250.0, 2500.0),  # 5G mmWave
}

# --link-scale divides both rates so that one block's upload time over its verification time matches a
# GPU-class verifier: S = T_verify(CPU, here) / T_verify(GPU, paper). With the same payload and nominal
# rate, dividing the rate by S multiplies the serialisation time by S and restores the paper's ratio
# (the propagation delay is not scaled).
#   GPU side: the paper's target is a 32B model on A100s. Qwen's published speed benchmark (Qwen2.5 docs,
#     docs/source/benchmark/speed_benchmark.rst in QwenLM/Qwen2.5: A100 80GB, vLLM 0.6.3, bf16, batch 1,
#     input length 1, 2048 generated tokens) gives Qwen2.5-32B-Instruct 22.13 tok/s on one A100 = 45.2 ms
#     per forward, and Qwen2.5-1.5B-Instruct 183.33 tok/s = 5.45 ms. At batch 1 a width-8 verification is
#     bound by reading the weights, so on a GPU it costs about one decode forward.
#   CPU side: `PYTHONPATH=src python scripts/measure_verify_cpu.py` (Qwen2.5-Coder-1.5B bf16, one torch
#     thread, a width-8 block after the 118-token HumanEval/0 prompt). Measured on this 2-core machine
#     while other agents ran (load average 2-4): width 8: min 2.04-2.47 s, median 2.78-3.55 s over two
#     runs; width 1: min 0.70-0.73 s, median 0.74-1.02 s.
#   S = 2.0 s / 45.2 ms = 44 for width-8 blocks; the default is 40, rounded down so as not to overstate the
#     network's share. Against the same 1.5B model on one A100 (5.45 ms) S would be ~370: an upper bound,
#     for a verifier far faster than the paper's. For other block widths use T_cpu(width) / 45.2 ms.
GPU_VERIFY_S_32B_A100 = 1.0 / 22.13
GPU_VERIFY_S_1P5B_A100 = 1.0 / 183.33
CPU_VERIFY_S_WIDTH8 = 2.0
DEFAULT_LINK_SCALE = 40.0


@dataclass(frozen=True)
class LinkProfile:
    """Rates in Mbit/s (math.inf = unshaped) and one-way propagation delay per direction in ms."""

    name: str
    up_mbit: float
    down_mbit: float
    up_delay_ms: float = DEFAULT_ONE_WAY_DELAY_MS
    down_delay_ms: float = DEFAULT_ONE_WAY_DELAY_MS
    scale: float = 1.0

    @property
    def up_bytes_per_s(self) -> float:
        return self.up_mbit * 1e6 / 8

    @property
    def down_bytes_per_s(self) -> float:
        return self.down_mbit * 1e6 / 8

    def describe(self) -> str:
        scaled = f" (link scale {self.scale:g})" if self.scale != 1.0 else ""
        return (
            f"{self.name}: up {self.up_mbit:g} Mbit/s, down {self.down_mbit:g} Mbit/s, "
            f"one-way delay up {self.up_delay_ms:g} ms / down {self.down_delay_ms:g} ms{scaled}"
        )


def _positive_rate(value: float, what: str) -> float:
    if not (isinstance(value, int | float) and value > 0 and not math.isnan(value)):
        raise InputError(f"{what} must be a positive number of Mbit/s, got {value!r}")
    return float(value)


def _delay(value: float, what: str) -> float:
    if not (isinstance(value, int | float) and 0 <= value < math.inf):
        raise InputError(f"{what} must be a finite number of milliseconds >= 0, got {value!r}")
    return float(value)


def resolve_profile(
    name: str | None = None,
    up_mbit: float | None = None,
    down_mbit: float | None = None,
    delay_ms: float | None = None,
    up_delay_ms: float | None = None,
    down_delay_ms: float | None = None,
    scale: float = 1.0,
) -> LinkProfile:
    """A named profile with optional overrides, or a custom one from --up/--down; rates divided by `scale`."""
    if name is not None and name not in PROFILE_RATES_MBIT:
        raise InputError(
            f"unknown link profile {name!r}; choose one of {', '.join(PROFILE_RATES_MBIT)} or give --up/--down"
        )
    if name is None and (up_mbit is None or down_mbit is None):
        raise InputError("give a link profile (weak, medium, strong) or both --up and --down in Mbit/s")
    base_up, base_down = PROFILE_RATES_MBIT.get(name, (math.nan, math.nan))
    up = _positive_rate(base_up if up_mbit is None else up_mbit, "the uplink rate")
    down = _positive_rate(base_down if down_mbit is None else down_mbit, "the downlink rate")
    common = _delay(DEFAULT_ONE_WAY_DELAY_MS if delay_ms is None else delay_ms, "the one-way delay")
    if not (isinstance(scale, int | float) and 0 < scale < math.inf):
        raise InputError(f"the link scale must be a positive finite number, got {scale!r}")
    overridden = up_mbit is not None or down_mbit is not None
    profile = LinkProfile(
        name=(name or "custom") + ("*" if name and overridden else ""),
        up_mbit=up,
        down_mbit=down,
        up_delay_ms=_delay(common if up_delay_ms is None else up_delay_ms, "the uplink delay"),
        down_delay_ms=_delay(common if down_delay_ms is None else down_delay_ms, "the downlink delay"),
    )
    return scaled(profile, scale)


def scaled(profile: LinkProfile, scale: float) -> LinkProfile:
    """Both rates divided by `scale` (delays unchanged: the factor corrects for verifier speed, not distance)."""
    return replace(profile, up_mbit=profile.up_mbit / scale, down_mbit=profile.down_mbit / scale, scale=scale)
