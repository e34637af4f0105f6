"""The decoding commands' options, read once from the command line into a frozen value.

The argparse namespace is never written to: what a command derives (the methods to run, As²d's
settings filled from the deployed configuration, a workload's default models) is a new value
made with `dataclasses.replace`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from asyncspec.errors import InputError
from asyncspec.profiling.deployed import As2dSettings, deployed_as2d

if TYPE_CHECKING:  # both import torch: not while the command line is only being parsed
    from asyncspec.decoding.result import DecodeConfig


PRECISION_CHOICES = ["auto", "int8", "bf16", "fp32", "fp16"]
DTYPE_HELP = (
    "the target's precision: int8 weights with per-row int8 activations (exact at every width on every x86 "
    "CPU), a float dtype, or auto, the default (int8, bf16 or fp32: the fastest on this CPU, measured once)"
)


def add_dtype_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="auto", choices=PRECISION_CHOICES, help=DTYPE_HELP)


def add_decoding_options(parser: argparse.ArgumentParser, default_model: str | None, default_drafter: str | None):
    """The options every decoding command takes; `DecodingOptions.from_args` reads them back."""
    parser.add_argument("--model", default=default_model, help="registered name, local directory or HF id")
    parser.add_argument(
        "--method", default="target", help="comma list of: auto, as2d, target, sd, specasr (default: %(default)s)"
    )
    parser.add_argument("--drafter", default=default_drafter, help="drafter model for sd/specasr")
    parser.add_argument("--budget", type=int, default=None, help="proposals per round (sd: 7, specasr cap: 24)")
    parser.add_argument("--compare", action="store_true", help="also run target-only, check equality, print a table")
    parser.add_argument("--trace", metavar="FILE", help="save every decode's stage events as JSON")
    parser.add_argument(
        "--producer",
        default=None,
        choices=["ct2-chunk", "autoregressive"],
        help="as2d: chunked CTranslate2 recogniser, or a transformers drafter over the whole window "
        "(default: the deployed configuration from select-budget, else ct2-chunk)",
    )
    parser.add_argument("--producer-model", default="whisper-tiny.en", help="as2d: the producer's recogniser")
    parser.add_argument(
        "--chunk-s", type=float, default=None, help="as2d: seconds of audio per chunk (default: deployed, else 4)"
    )
    add_dtype_option(parser)
    parser.add_argument(
        "--encoder",
        default="auto",
        choices=["auto", "fp32", "bf16", "int8"],
        help="speech models: the encoder's dtype (auto: the fastest on this machine, measured once and "
        "cached; int8 only where it takes at most 0.8 of the float encoders' time)",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the target (one core each)")


@dataclass(frozen=True)
class DecodingOptions:
    model: str | None
    drafter: str | None  # sd/specasr's drafter model
    methods: tuple[str, ...]
    dtype: str
    encoder: str  # speech models: the encoder's dtype, or auto
    producer: str  # As²d's producer kind
    producer_model: str
    chunk_s: float
    budget: int | None  # --budget as given: every method's proposals per round
    as2d_budget: int | None  # As²d's: --budget, else the deployed configuration's
    temperature: float
    seed: int
    compare: bool = False
    trace: str | None = None
    as2d: As2dSettings | None = None  # As²d's settings and where they came from
    method_note: str | None = None  # what --method auto chose and why (the command's start-up line says it)

    @classmethod
    def from_args(cls, args, required_producer: str | None = None) -> DecodingOptions:
        """The options `add_decoding_options` defines (As²d's unset ones from the deployed
        configuration; when As²d runs, a line on stderr says which one, or why one was ignored).
        `required_producer`: the one producer kind the command drafts with (deployed_as2d)."""
        from asyncspec.decoding.methods import parse_methods
        from asyncspec.transcription.method_choice import AUTO, resolve_auto

        asked = tuple(parse_methods(args.method, also=(AUTO,)))
        methods, method_note = resolve_auto(asked, compare=args.compare)
        as2d = deployed_as2d(args.producer, args.chunk_s, args.budget, required_producer)
        if "as2d" in methods and (note := as2d.note()):
            print(note, file=sys.stderr)
        return cls(
            model=args.model,
            drafter=args.drafter,
            methods=methods,
            dtype=args.dtype,
            encoder=args.encoder,
            producer=as2d.producer,
            producer_model=args.producer_model,
            chunk_s=as2d.chunk_s,
            budget=args.budget,
            as2d_budget=as2d.budget,
            temperature=args.temperature,
            seed=args.seed,
            compare=args.compare,
            trace=args.trace,
            as2d=as2d,
            method_note=method_note,
        )

    def running(self, methods: list[str]) -> DecodingOptions:
        return replace(self, methods=tuple(methods))

    def as2d_record(self) -> dict[str, Any] | None:
        """As²d's configuration for the JSON results (producer, chunk, budget, source), when it runs."""
        from asyncspec.decoding.as2d import DEFAULT_BUDGET

        if "as2d" not in self.methods or self.as2d is None:
            return None
        return self.as2d.record(DEFAULT_BUDGET)


def decode_config(options: DecodingOptions) -> DecodeConfig:
    """The settings every method shares, checked once."""
    from asyncspec.decoding.result import DecodeConfig

    if options.budget is not None and options.budget < 1:
        raise InputError(f"--budget must be at least 1, got {options.budget}")
    if options.temperature < 0:
        raise InputError(f"--temperature must be >= 0, got {options.temperature}")
    deployed = (("as2d", options.as2d_budget),) if options.as2d_budget else ()
    return DecodeConfig(
        temperature=options.temperature, seed=options.seed, budget=options.budget, method_budgets=deployed
    )
