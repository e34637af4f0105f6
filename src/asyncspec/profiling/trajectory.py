"""What replay needs from native runs of one window: the target's reference tokens, and each
producer's publications (times relative to the start of decoding, i.e. the end of prefill).

Because an As²d producer never reads target state, its publication stream is the same whatever
budget the target uses, so one native run per producer prices every budget. The native runs'
own stage events are kept too, so replay can be checked against them exactly."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asyncspec.decoding.result import DecodeResult
from asyncspec.errors import InputError
from asyncspec.trace import StageEvent

EOS = -1  # stands for the target's end-of-sequence decision after the last reference token


@dataclass(frozen=True)
class Publication:
    offset: int
    tokens: tuple[int, ...]
    confidences: tuple[float, ...] | None
    started: float  # seconds after decoding started
    published: float
    drained_at_refresh: int  # the native run's refresh() call that delivered it (1-based)


@dataclass
class NativeRun:
    method: str
    budget: int | None
    decode_s: float
    n_tokens: int
    events: list[StageEvent]  # decode-relative (prefill end = 0)


@dataclass
class WindowTrajectory:
    window: str
    dataset: str
    fingerprint: str  # sha1 of the audio samples: keeps development and test windows apart
    prompt_len: int
    max_length: int  # target positions
    limit: int  # most tokens the methods may commit
    tokens: list[int]  # target-only greedy output
    finish_reason: str  # "eos" or "length"
    sources: dict[str, list[Publication]] = field(default_factory=dict)  # producer name -> publications
    native: dict[str, NativeRun] = field(default_factory=dict)  # "target", "as2d:<source>", "sd", ...
    call_sizes: list[int] | None = None  # rows its As²d run's target calls could run at (None: any width)
    call_seconds: dict[int, float] | None = None  # the As²d run's verify plan timings (as2d.verify_plan), if any

    def target_next(self, index: int) -> int:
        """The target's greedy token at output position `index` (EOS past the end)."""
        return self.tokens[index] if index < len(self.tokens) else EOS

    def room(self, n_committed: int) -> int:
        """Candidates a round may verify after n committed tokens (the output limit, the positions)."""
        return min(self.limit - n_committed, self.max_length - self.prompt_len - n_committed)

    def add_native(self, key: str, result: DecodeResult, budget: int | None = None) -> None:
        if result.method != "target" and result.tokens != self.tokens:
            raise InputError(f"{self.window}: {key} output differs from target-only; its trajectory is not replayable")
        start = result.stats.prefill_s
        events = [StageEvent(e.stage, e.start - start, e.end - start, e.meta) for e in result.trace.events]
        publications = [_publication(e) for e in events if e.stage == "publish"]
        events = [e for e in events if e.stage != "publish"]
        self.native[key] = NativeRun(result.method, budget, result.stats.decode_s, len(result.tokens), events)
        if result.method == "as2d":  # key "as2d:<producer>"
            self.sources[key.removeprefix("as2d:")] = publications
            figures = result.stats.as2d  # replay proposes as this run did: its call sizes and plan
            self.call_sizes, self.call_seconds = figures.call_sizes, figures.call_seconds


def _publication(event: StageEvent) -> Publication:
    meta = event.meta
    confidences = None if meta["confidences"] is None else tuple(meta["confidences"])
    return Publication(
        meta["offset"], tuple(meta["tokens"]), confidences, event.start, event.end, meta["drained_at_refresh"]
    )


def fingerprint(samples: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(samples, dtype=np.float32).tobytes()).hexdigest()


def reference_trajectory(window: str, dataset: str, samples: np.ndarray, target, result: DecodeResult, request):
    """A trajectory seeded with a target-only run of `request`."""
    from asyncspec.decoding.result import output_limit

    trajectory = WindowTrajectory(
        window=window,
        dataset=dataset,
        fingerprint=fingerprint(samples),
        prompt_len=len(request.prompt_ids),
        max_length=target.max_length,
        limit=output_limit(request, target),
        tokens=list(result.tokens),
        finish_reason=result.stats.finish_reason,
    )
    trajectory.add_native("target", result)
    return trajectory


def save_trajectories(path: Path | str, trajectories: list[WindowTrajectory]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps([asdict(t) for t in trajectories]))


def load_trajectories(path: Path | str) -> list[WindowTrajectory]:
    try:
        rows = json.loads(Path(path).read_text())
        if not isinstance(rows, list):
            raise TypeError("expected a list of windows")
        return [_trajectory(row) for row in rows]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise InputError(f"{path}: not a trajectory file ({error})") from error


def _trajectory(row: dict[str, Any]) -> WindowTrajectory:
    sources = {
        name: [
            Publication(
                p["offset"],
                tuple(p["tokens"]),
                None if p["confidences"] is None else tuple(p["confidences"]),
                p["started"],
                p["published"],
                p["drained_at_refresh"],
            )
            for p in pubs
        ]
        for name, pubs in row.pop("sources").items()
    }
    native = {
        key: NativeRun(n["method"], n["budget"], n["decode_s"], n["n_tokens"], [StageEvent(**e) for e in n["events"]])
        for key, n in row.pop("native").items()
    }
    width = row.pop("call_width", None)  # files written before calls had several sizes
    if width is not None and row.get("call_sizes") is None:
        row["call_sizes"] = [width]
    if row.get("call_seconds") is not None:
        row["call_seconds"] = {int(size): float(seconds) for size, seconds in row["call_seconds"].items()}
    return WindowTrajectory(**row, sources=sources, native=native)
