"""The deployed As²d configuration: one fixed producer and budget chosen offline by
`asyncspec select-budget`, read by `transcribe`, `demo` and the benchmarks when the user does
not pass --producer/--chunk-s/--budget. Where it lives: $ASYNCSPEC_CONFIG, else
~/.config/asyncspec/as2d.json. It applies only on the CPU (model and flags) it was measured on;
a command that uses one, or ignores one made elsewhere, says so in one line on stderr."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from asyncspec.errors import InputError
from asyncspec.models.machine import cpu_fingerprint, cpu_model

CONFIG_ENV = "ASYNCSPEC_CONFIG"
DEFAULT_PRODUCER = "ct2-chunk@4s"
# Sources searched by select-budget and the oracle (seed 000 D.4.3: source x budget): the chunked
# CTranslate2 recogniser and the autoregressive drafter. Other chunk lengths (ct2-chunk@6s, ...) can be
# added with --producers / --catalog.
CATALOG = "ct2-chunk@4s,autoregressive"
# Where As²d's settings came from, as the JSON results record it.
COMMAND_LINE = "command line"
BUILT_IN = "built-in default"
# The ends of the stderr notes: how to see or remove a deployed configuration, how to replace one made elsewhere.
SEE = "`asyncspec config show` shows it, `asyncspec config reset` removes it"
FIX = "run `asyncspec select-budget` on this machine again, or `asyncspec config reset`"


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
    default_pooled_tps: float | None = None  # the built-in default's, on the same split
    # Stamped by save_deployed. A file without them (an older asyncspec's) is of unknown origin.
    made_at: str | None = None  # UTC, ISO 8601
    cpu: str | None = None  # the CPU's model name, for people
    machine: str | None = None  # cpu_fingerprint(): the CPU model and flags it was measured on

    @property
    def choice(self) -> ProducerChoice:
        return ProducerChoice.parse(self.producer)

    def provenance(self) -> str:
        return f"made {self.made_at or 'at an unknown time'} on {self.cpu or 'an unknown CPU'}"

    def describe(self) -> str:
        return f"{self.producer} budget {self.budget}, {self.provenance()}"

    def foreign_reason(self) -> str | None:
        """Why this configuration does not apply to this machine, or None when it does: its speeds
        were measured on another CPU model or flags, or nobody knows where."""
        if self.made_at is None or self.machine is None:
            return "written by an older asyncspec, without the date and CPU it was made on"
        if self.machine == cpu_fingerprint():
            return None
        if self.cpu != cpu_model():
            return f"made on another CPU ({self.cpu}; this one is {cpu_model()})"
        return f"made on this CPU model ({self.cpu}) with other instruction-set flags"


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or Path.home() / ".config" / "asyncspec" / "as2d.json")


def save_deployed(config: DeployedConfig, path: Path | None = None) -> Path:
    """Write the configuration stamped with the time and this machine's CPU (what it was measured on)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    made_at = datetime.now(UTC).isoformat(timespec="seconds")
    stamped = replace(config, made_at=made_at, cpu=cpu_model(), machine=cpu_fingerprint())
    path.write_text(json.dumps(asdict(stamped), indent=1))
    return path


def load_deployed(path: Path | None = None) -> DeployedConfig | None:
    """The deployed configuration as written, wherever it was made, or None when none was selected yet."""
    path = path or config_path()
    if not path.exists():
        return None
    try:
        return DeployedConfig(**json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise InputError(
            f"{path}: not a deployed configuration ({error}); re-run asyncspec select-budget or asyncspec config reset"
        ) from error


@dataclass(frozen=True)
class Deployment:
    """The deployed file as this machine reads it."""

    path: Path
    config: DeployedConfig | None  # the configuration when there is one and it applies here
    ignored: str | None = None  # why a configuration there does not apply here

    @property
    def source(self) -> str:
        return f"deployed {self.path}"

    def note(self) -> str | None:
        """The one line a command prints on stderr: the configuration it uses, or why it ignores one."""
        if self.config is not None:
            return f"asyncspec: As²d uses the deployed configuration {self.path} ({self.config.describe()}); {SEE}"
        if self.ignored is not None:
            return f"asyncspec: note: ignoring the deployed configuration {self.path}: {self.ignored}; {FIX}"
        return None


def current_deployment(path: Path | None = None) -> Deployment:
    """The configuration at `path` (default: config_path()) if it was made on this CPU."""
    path = path or config_path()
    config = load_deployed(path)
    reason = config.foreign_reason() if config is not None else None
    return Deployment(path, None if reason else config, reason)


@dataclass(frozen=True)
class As2dSettings:
    producer: str  # ct2-chunk or autoregressive
    chunk_s: float
    budget: int | None  # None: As²d's default
    # Where the values came from: "command line", "deployed <path>", "built-in default", or several
    # of them joined by " + " when the user gave some options and not others.
    source: str = BUILT_IN
    deployment: Deployment | None = None  # the deployed file consulted for the unset options

    def note(self) -> str | None:
        """The line for stderr when a deployed file was used or ignored (None when none was consulted)."""
        return self.deployment.note() if self.deployment else None

    def record(self, default_budget: int) -> dict[str, Any]:
        """What a command's or benchmark's JSON says about the configuration As²d ran with."""
        record: dict[str, Any] = {
            "producer": ProducerChoice(self.producer, self.chunk_s).name,
            "chunk_s": self.chunk_s,
            "budget": self.budget or default_budget,
            "source": self.source,
        }
        deployment = self.deployment
        if deployment is not None and deployment.config is not None:
            record |= {"made_at": deployment.config.made_at, "cpu": deployment.config.cpu}
        if deployment is not None and deployment.ignored is not None:
            record["ignored"] = f"{deployment.path}: {deployment.ignored}"
        return record


def deployed_as2d(
    producer: str | None, chunk_s: float | None, budget: int | None, required: str | None = None
) -> As2dSettings:
    """The As²d options the user gave, those left unset (None) taken from the deployed
    configuration when it was made on this CPU (else the built-in defaults). Its budget applies
    only to its own producer kind. `required`: the one producer kind the caller drafts with
    (long-form transcription: ct2-chunk); a deployed configuration of another kind is ignored, with
    a note, as one made on another CPU is."""
    if producer is not None and chunk_s is not None and budget is not None:
        return As2dSettings(producer, chunk_s, budget, COMMAND_LINE)
    deployment = _for_kind(current_deployment(), required)
    deployed = deployment.config
    choice = deployed.choice if deployed else ProducerChoice.parse(required or DEFAULT_PRODUCER)
    fallback = deployment.source if deployed else BUILT_IN
    origins = [COMMAND_LINE if producer is not None else fallback, COMMAND_LINE if chunk_s is not None else fallback]
    producer = choice.kind if producer is None else producer
    chunk_s = choice.chunk_s if chunk_s is None else chunk_s
    if budget is not None:
        origins.append(COMMAND_LINE)
    elif deployed is not None and producer == choice.kind:
        budget = deployed.budget
        origins.append(fallback)
    else:
        origins.append(BUILT_IN)
    used = deployment.source in origins or deployment.ignored is not None
    source = " + ".join(dict.fromkeys(origins))
    return As2dSettings(producer, chunk_s, budget, source, deployment if used else None)


def _for_kind(deployment: Deployment, required: str | None) -> Deployment:
    """`deployment`, ignored where its producer is not the `required` kind: select-budget ranks
    producers on short windows, where the autoregressive one may win, but a long-form transcript
    needs drafts that carry audio time."""
    config = deployment.config
    if required is None or config is None or config.choice.kind == required:
        return deployment
    reason = (
        f"its {config.choice.kind} producer cannot draft long-form transcripts, which As²d drafts with "
        f"{required} (`asyncspec select-budget --producers ct2-chunk@4s,ct2-chunk@6s` ranks those alone)"
    )
    return replace(deployment, config=None, ignored=reason)
