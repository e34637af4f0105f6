"""The target and its drafters from the decoding options: a prefix-conditioned model for
sd/specasr, a producer process for As²d."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from asyncspec.errors import InputError, ModelNotPreparedError
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
    """The producer for `options.model`, spawned before the target loads (its tokenizer read from the
    model's files); None when those files are not at hand (it then starts after the target)."""
    from pathlib import Path

    from asyncspec.models.registry import resolve_source
    from asyncspec.ondevice.producer import ProducerProcess

    try:
        tokenizer_file = Path(resolve_source(options.model)[0]) / "tokenizer.json"
    except (InputError, ModelNotPreparedError):
        return None  # the target's own load reports it
    if not tokenizer_file.is_file():
        return None
    spec = producer_spec(
        options.producer, options.chunk_s, options.producer_model, options.dtype, tokenizer_file.read_text()
    )
    return ProducerProcess(spec, wait=False)


def start_producer(options: DecodingOptions, target: Decoder):
    return make_producer(options.producer, options.chunk_s, options.producer_model, options.dtype, target)


def make_producer(kind: str, chunk_s: float, producer_model: str, dtype: str, target: Decoder):
    """A persistent producer worker process for As²d (close it when done)."""
    from asyncspec.ondevice.producer import ProducerProcess

    return ProducerProcess(producer_spec(kind, chunk_s, producer_model, dtype, target.tokenizer.backend.to_str()))


def producer_spec(kind: str, chunk_s: float, producer_model: str, dtype: str, target_tokenizer_json: str):
    from asyncspec.models.offline import ct2_model_dir
    from asyncspec.ondevice.producer import ProducerSpec

    if chunk_s <= 0:
        raise InputError(f"--chunk-s must be positive, got {chunk_s}")
    chunked = kind == "ct2-chunk"
    return ProducerSpec(
        kind=kind,
        model_dir=str(ct2_model_dir(producer_model)) if chunked else "",
        drafter=producer_model,
        dtype=dtype,
        target_tokenizer_json=target_tokenizer_json,
        chunk_s=chunk_s,
    )
