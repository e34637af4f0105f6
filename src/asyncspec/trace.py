"""Monotonic stage events of one decode: what ran when (seconds from the request's start)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StageEvent:
    stage: str  # prefill, draft, verify, correct, convert, loop
    start: float
    end: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Trace:
    origin: float = field(default_factory=time.perf_counter)
    events: list[StageEvent] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.origin

    @contextmanager
    def stage(self, name: str, **meta: Any) -> Iterator[dict[str, Any]]:
        """Record one stage; the yielded dict can gain metadata while the stage runs."""
        start = self.now()
        try:
            yield meta
        finally:
            self.events.append(StageEvent(name, start, self.now(), meta))

    def total(self, stage: str) -> float:
        return sum(event.duration for event in self.events if event.stage == stage)

    def to_json(self) -> dict[str, Any]:
        return {"events": [asdict(event) for event in self.events]}

    def save(self, path: Path | str) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: Path | str) -> Trace:
        data = json.loads(Path(path).read_text())
        return cls(origin=0.0, events=[StageEvent(**event) for event in data["events"]])
