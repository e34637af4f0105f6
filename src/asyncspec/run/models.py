"""The target and its drafters from the decoding options: a prefix-conditioned model for
sd/specasr, a producer process for As²d."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from asyncspec.errors import InputError
from asyncspec.models.base import Decoder
from asyncspec.run.compare import needs_drafter
from asyncspec.run.options import DecodingOptions

AnyDecoder = TypeVar("AnyDecoder", bound=Decoder)  # the kind of target a command asked for


@contextmanager
def load_models(
    options: DecodingOptions, kind: type[AnyDecoder], what: str
) -> Iterator[tuple[AnyDecoder, dict[str, Any]]]:
    """The target and, per method, its drafter: a prefix-conditioned model for sd/specasr, a
    producer process for as2d (closed on exit)."""
    from asyncspec.models.registry import load_decoder

    # As²d's producer process spawns first and loads its model while the target loads
    producer = spawn_producer_early(options) if "as2d" in options.methods else None
    try:
        target = load_decoder(options.model, options.dtype, encoder=options.encoder)
        if not isinstance(target, kind):
            raise InputError(f"{options.model} is not a {what} model")
        print(f"loaded {target.describe()}", file=sys.stderr, flush=True)  # the precision auto chose, and why
        drafters: dict[str, Any] = {}
        if needs_drafter(options.methods):
            drafter = load_decoder(options.drafter, options.dtype, engine="transformers")
            drafters.update(sd=drafter, specasr=drafter)
        if "as2d" in options.methods and producer is None:
            producer = start_producer(options, target)
        drafters["as2d"] = producer
        yield target, drafters
    finally:
        if producer is not None:
            producer.close()


def spawn_producer_early(options: DecodingOptions):
    from asyncspec.transcription.loading import spawn_producer_early as spawn

    if options.model is None:
        return None
    return spawn(options.model, options.producer, options.chunk_s, options.producer_model, options.dtype)


def start_producer(options: DecodingOptions, target: Decoder):
    from asyncspec.transcription.loading import make_producer

    return make_producer(options.producer, options.chunk_s, options.producer_model, options.dtype, target)
