"""The deployed As²d configuration: one fixed producer and budget chosen offline by
`asyncspec select-budget`, read by `transcribe`, `demo` and the benchmarks when the user does
not pass --producer/--chunk-s/--budget. Where it lives: $ASYNCSPEC_CONFIG, else
~/.config/asyncspec/as2d.json."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asyncspec.errors import InputError

CONFIG_ENV = "ASYNCSPEC_CONFIG"
DEFAULT_PRODUCER = "ct2-chunk@4s"
# Sources searched by select-budget and the oracle (seed 000 D.4.3: source x budget): the chunked
# CTranslate2 recogniser and the autoregressive drafter. Other chunk lengths (ct2-chunk@6s, ...) can be
# added with --producers / --catalog.
CATALOG = "ct2-chunk@4s,autoregressive"


@dataclass(frozen=True)
class ProducerChoice:
    """A catalog entry: which producer process, and its chunk length when chunked."""

    kind: str  # "ct2-chunk" or "autoregressive"
    chunk_s: float = 4.0

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.chunk_s:g}s" if self.kind == "ct2-chunk" else self.kind

    @classmethod
    def parse(cls, name: str) -> ProducerChoice:
        kind, _, chunk = name.partition("@")
        if kind not in ("ct2-chunk", "autoregressive"):
            raise InputError(f"unknown producer {name!r}: use ct2-chunk@<seconds>s or autoregressive")
        try:
            return cls(kind, float(chunk.removesuffix("s")) if chunk else 4.0)
        except ValueError as error:
            raise InputError(f"bad chunk length in producer {name!r}") from error


def parse_catalog(text: str) -> list[ProducerChoice]:
    choices = [ProducerChoice.parse(name.strip()) for name in text.split(",") if name.strip()]
    if not choices:
        raise InputError("the producer catalog is empty")
    return choices


@dataclass
class DeployedConfig:
    producer: str  # a ProducerChoice name
    producer_model: str
    budget: int
    pooled_tps: float  # on the development split, by replay
    development: dict[str, Any] = field(default_factory=dict)  # windows, fingerprints, profile, ranking

    @property
    def choice(self) -> ProducerChoice:
        return ProducerChoice.parse(self.producer)


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or Path.home() / ".config" / "asyncspec" / "as2d.json")


def save_deployed(config: DeployedConfig, path: Path | None = None) -> Path:
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(config), indent=1))
    return path


def load_deployed(path: Path | None = None) -> DeployedConfig | None:
    """The deployed configuration, or None when none was selected yet."""
    path = path or config_path()
    if not path.exists():
        return None
    try:
        return DeployedConfig(**json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise InputError(f"{path}: not a deployed configuration ({error}); re-run asyncspec select-budget") from error


@dataclass(frozen=True)
class As2dSettings:
    producer: str  # ct2-chunk or autoregressive
    chunk_s: float
    budget: int | None  # None: As²d's default


def deployed_as2d(producer: str | None, chunk_s: float | None, budget: int | None) -> As2dSettings:
    """The As²d options the user gave, those left unset (None) taken from the deployed
    configuration (or the defaults). Its budget applies only to its own producer kind."""
    deployed = load_deployed()
    choice = deployed.choice if deployed else ProducerChoice.parse(DEFAULT_PRODUCER)
    producer = choice.kind if producer is None else producer
    chunk_s = choice.chunk_s if chunk_s is None else chunk_s
    matches = deployed is not None and producer == choice.kind
    if budget is None and matches:
        budget = deployed.budget
    return As2dSettings(producer, chunk_s, budget)
