"""A device cost profile (seed 000 §4.3, App. B.2): measured target verification call times per
physical width K, prefix offset and coexistence mode, plus the per-round loop costs that replay
charges. Only measured widths are priced: a width missing from the profile is an error, never a
zero cost (App. D.2.1)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from asyncspec.errors import InputError

IDLE, CONCURRENT = "idle", "concurrent"
DEFAULT_WIDTHS = tuple(range(1, 26))  # budgets 1..24 plus the known root
DEFAULT_OFFSETS = (0, 32, 64)  # output tokens in the cache before the call


@dataclass
class CostProfile:
    target: str
    dtype: str
    # mode -> offset (output tokens already in the cache) -> width K -> call seconds, one per repetition
    verify: dict[str, dict[int, dict[int, list[float]]]]
    align_s: float  # As²d per round: buffer drain + cursor alignment + candidate read
    gap_s: float  # As²d per round outside the stages: commit, rollback, loop bookkeeping
    target_gap_s: float  # target-only per token outside the call
    delivery_s: float  # producer publication -> readable in the target's buffer
    lead_s: float = 0.0  # As²d: decoding start -> first round (handing the audio to the producer)
    drafter_call_s: float = 0.0  # sd/specasr: fixed cost of one drafting stage
    drafter_step_s: float = 0.0  # ... plus this per drafter forward call
    producer: dict[str, Any] = field(default_factory=dict)  # informational: chunk/step costs measured
    device: dict[str, Any] = field(default_factory=dict)

    @property
    def widths(self) -> list[int]:
        return sorted({k for offsets in self.verify.values() for by_k in offsets.values() for k in by_k})

    def verify_s(self, width: int, offset: int, concurrent: bool = False) -> float:
        """Mean call time at this width, linearly interpolated between the profiled offsets."""
        mode = CONCURRENT if concurrent and self.verify.get(CONCURRENT) else IDLE
        by_offset = self.verify[mode]
        offsets = sorted(by_offset)
        if any(width not in by_offset[o] for o in offsets):
            raise InputError(f"width K={width} was not profiled (profiled: {self.widths}); re-run asyncspec profile")
        if offset <= offsets[0] or len(offsets) == 1:
            return mean(by_offset[offsets[0]][width])
        for low, high in zip(offsets, offsets[1:], strict=False):
            if offset <= high:
                share = (offset - low) / (high - low)
                return (1 - share) * mean(by_offset[low][width]) + share * mean(by_offset[high][width])
        return mean(by_offset[offsets[-1]][width])

    def mean_over_offsets(self, width: int, mode: str = IDLE) -> tuple[float, float]:
        """(mean, sample standard deviation) of the width's calls pooled over offsets."""
        samples = [s for by_k in self.verify[mode].values() for s in by_k.get(width, [])]
        return mean(samples), stdev(samples) if len(samples) > 1 else 0.0

    def saving(self, width: int, mode: str = IDLE) -> float:
        """R(K) = 1 - V(K) / (K V(1)): per-position saving of a width-K call (seed 000 eq. 2)."""
        return 1.0 - self.mean_over_offsets(width, mode)[0] / (width * self.mean_over_offsets(1, mode)[0])

    def concurrent_ratio(self, width: int) -> float | None:
        if not self.verify.get(CONCURRENT):
            return None
        return self.mean_over_offsets(width, CONCURRENT)[0] / self.mean_over_offsets(width, IDLE)[0]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = {
            str(k): {
                "idle_ms": round(1000 * self.mean_over_offsets(k)[0], 2),
                "concurrent_ms": round(1000 * self.mean_over_offsets(k, CONCURRENT)[0], 2)
                if self.verify.get(CONCURRENT)
                else None,
                "saving_R": round(self.saving(k), 4),
            }
            for k in self.widths
        }
        return data

    def save(self, path: Path | str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: Path | str) -> CostProfile:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise InputError(f"{path}: not a readable cost profile ({error})") from error
        data.pop("summary", None)
        try:
            data["verify"] = {
                mode: {int(o): {int(k): list(v) for k, v in by_k.items()} for o, by_k in offsets.items()}
                for mode, offsets in data["verify"].items()
            }
            return cls(**data)
        except (KeyError, TypeError, ValueError) as error:
            raise InputError(f"{path}: not a cost profile ({error})") from error
