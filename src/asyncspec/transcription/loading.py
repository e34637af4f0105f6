"""The target and As²d's producer for a transcriber: the producer process is spawned first, so it
loads its recogniser on one core while the target loads on the other."""

from __future__ import annotations

from pathlib import Path

from asyncspec.errors import InputError, ModelNotPreparedError

LONGFORM_PRODUCER = "ct2-chunk"  # the source that tags its publications with audio time


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


def spawn_producer_early(model: str, kind: str, chunk_s: float, producer_model: str, dtype: str):
    """The producer for `model`, spawned before the target loads (its tokenizer read from the
    model's files); None when those files are not at hand (it then starts after the target)."""
    from asyncspec.models.registry import resolve_source
    from asyncspec.ondevice.producer import ProducerProcess

    try:
        tokenizer_file = Path(resolve_source(model)[0]) / "tokenizer.json"
    except (InputError, ModelNotPreparedError):
        return None  # the target's own load reports it
    if not tokenizer_file.is_file():
        return None
    spec = producer_spec(kind, chunk_s, producer_model, dtype, tokenizer_file.read_text())
    return ProducerProcess(spec, wait=False)


def make_producer(kind: str, chunk_s: float, producer_model: str, dtype: str, target):
    """A persistent producer worker process for As²d (close it when done)."""
    from asyncspec.ondevice.producer import ProducerProcess

    return ProducerProcess(producer_spec(kind, chunk_s, producer_model, dtype, target.tokenizer.backend.to_str()))


def load_speech_target(model: str, dtype: str, encoder: str):
    from asyncspec.models.hf_whisper import WhisperBackend
    from asyncspec.models.registry import load_decoder

    target = load_decoder(model, dtype, encoder=encoder)
    if not isinstance(target, WhisperBackend):
        raise InputError(f"{model} is not a speech model")
    return target
