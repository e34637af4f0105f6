"""The decoding settings every method shares, checked once."""

from __future__ import annotations

from asyncspec.decoding.result import DecodeConfig
from asyncspec.errors import InputError


def decode_config(args) -> DecodeConfig:
    if args.budget is not None and args.budget < 1:
        raise InputError(f"--budget must be at least 1, got {args.budget}")
    if args.temperature < 0:
        raise InputError(f"--temperature must be >= 0, got {args.temperature}")
    as2d_budget = getattr(args, "as2d_budget", None)
    return DecodeConfig(temperature=args.temperature, seed=args.seed, budget=args.budget, as2d_budget=as2d_budget)
