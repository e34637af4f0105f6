"""A device cost profile (seed 000 §4.3, App. B.2): measured target verification call times per
physical width K, prefix offset and coexistence mode, plus the per-round loop costs that replay
charges. Only measured widths are priced: a width missing from the profile is an error, never a
zero cost (App. D.2.1)."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from asyncspec.errors import InputError

IDLE, CONCURRENT = "idle", "concurrent"
DEFAULT_WIDTHS = tuple(range(1, 26))  # budgets 1..24 plus the known root
DEFAULT_OFFSETS = (0, 32, 64)  # output tokens in the cache before the call


def monotone_fit(samples_by_width: dict[int, list[float]]) -> dict[int, float]:
    """The per-width means, least-squares fitted to be non-decreasing in the width (pool adjacent
    violators, each width weighted by its number of samples)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, number of widths pooled]
    widths = sorted(samples_by_width)
    for width in widths:
        samples = samples_by_width[width]
        blocks.append([mean(samples), float(len(samples)), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (mean_b, weight_b, count_b), (mean_a, weight_a, count_a) = blocks.pop(), blocks.pop()
            weight = weight_a + weight_b
            blocks.append([(mean_a * weight_a + mean_b * weight_b) / weight, weight, count_a + count_b])
    fitted = [value for value, _, count in blocks for _ in range(int(count))]
    return dict(zip(widths, fitted, strict=True))


def _grid(profile: CostProfile) -> dict[str, dict[int, list[int]]]:
    return {mode: {o: sorted(by_k) for o, by_k in offsets.items()} for mode, offsets in profile.verify.items()}


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
        """Call time at this width (the monotone fit of the means: `_fitted`), linearly
        interpolated between the profiled offsets."""
        mode = CONCURRENT if concurrent and self.verify.get(CONCURRENT) else IDLE
        by_offset = self._fitted[mode]
        offsets = sorted(by_offset)
        if any(width not in by_offset[o] for o in offsets):
            raise InputError(f"width K={width} was not profiled (profiled: {self.widths}); re-run asyncspec profile")
        if offset <= offsets[0] or len(offsets) == 1:
            return by_offset[offsets[0]][width]
        for low, high in zip(offsets, offsets[1:], strict=False):
            if offset <= high:
                share = (offset - low) / (high - low)
                return (1 - share) * by_offset[low][width] + share * by_offset[high][width]
        return by_offset[offsets[-1]][width]

    @functools.cached_property
    def _fitted(self) -> dict[str, dict[int, dict[int, float]]]:
        """Per mode and offset, the mean call time of each width fitted to be non-decreasing in
        the width. A call with more real rows never does less work (the fixed-shape engine pads
        every call to whole blocks; only attention over the real rows grows), but the means of a
        few timed calls per width are noisy: one profile's concurrent sweep on a 2-core EPYC
        (2026-12-04, offset 32) gave K=4 33.1 ms, K=5 38.2 ms and K=8 33.3 ms, so a budget of 4
        (5 rows) was priced 15 % dearer per call than a budget of 7 (8 rows, the same one block)."""
        return {
            mode: {offset: monotone_fit(by_k) for offset, by_k in offsets.items()}
            for mode, offsets in self.verify.items()
        }

    def pooled_with(self, later: CostProfile) -> CostProfile:
        """This profile with `later`'s call timings added to its own (same modes, offsets and
        widths): costs measured before and after a stretch of runs, so that a drift of the
        machine's speed during the stretch is priced at its middle rather than at its start."""
        if _grid(self) != _grid(later):
            raise InputError("pooled profiles must cover the same modes, offsets and widths")
        verify = {
            mode: {
                offset: {k: samples + later.verify[mode][offset][k] for k, samples in by_k.items()}
                for offset, by_k in offsets.items()
            }
            for mode, offsets in self.verify.items()
        }
        return replace(self, verify=verify)

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
