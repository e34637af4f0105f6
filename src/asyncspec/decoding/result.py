"""What every decoding method returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncspec.trace import Trace


@dataclass(frozen=True)
class DecodeConfig:
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0


@dataclass
class DecodeStats:
    prefill_s: float = 0.0
    decode_s: float = 0.0  # after prefill, until the last token is committed
    target_calls: int = 0  # excluding prefill
    call_widths: list[int] = field(default_factory=list)
    finish_reason: str = ""  # "eos" or "length"

    def tps(self, n_tokens: int) -> float:
        return n_tokens / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class DecodeResult:
    method: str
    tokens: list[int]  # committed target token ids, end-of-sequence excluded
    stats: DecodeStats
    trace: Trace

    @property
    def tps(self) -> float:
        return self.stats.tps(len(self.tokens))
