"""Method names -> decode functions (all with the signature decode(target, drafter, request, config))."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncspec.decoding.as2d import decode_as2d
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.decoding.specasr import decode_specasr
from asyncspec.decoding.standard_sd import decode_standard_sd
from asyncspec.decoding.target_only import decode_target_only
from asyncspec.errors import InputError
from asyncspec.models.base import Decoder, DecodeRequest

DecodeFn = Callable[[Decoder, Any, DecodeRequest, DecodeConfig], DecodeResult]  # drafter: a Decoder or a producer

METHODS: dict[str, DecodeFn] = {
    "target": decode_target_only,
    "sd": decode_standard_sd,
    "specasr": decode_specasr,
    "as2d": decode_as2d,
}


def parse_methods(text: str, also: tuple[str, ...] = ()) -> list[str]:
    """The method names of a comma list; `also`: names the caller resolves itself (auto)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = [*also, *METHODS]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise InputError(f"unknown method {', '.join(unknown) or repr(text)}; choose from {', '.join(known)}")
    return names
