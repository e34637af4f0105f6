"""`asyncspec transcribe`: audio files -> windows -> one decode per window and method."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asyncspec.audio import AudioWindow, load_audio, split_windows
from asyncspec.commands.compare import equality_check, methods_to_run, needs_drafter, print_summary, run_jobs
from asyncspec.commands.report import progress
from asyncspec.decoding.result import DecodeConfig
from asyncspec.errors import InputError, ModelNotPreparedError
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.models.hf_whisper import WhisperBackend


def file_windows(paths: list[str]) -> list[tuple[str, AudioWindow]]:
    """Every file is read and validated before any decoding starts, so one bad file loses nothing."""
    return [(path, window) for path in paths for window in split_windows(load_audio(path))]


def window_jobs(
    target: WhisperBackend, windows: list[tuple[str, AudioWindow]], language: str = "en"
) -> Iterator[tuple[dict[str, Any], DecodeRequest]]:
    for path, window in progress(windows, len(windows), "transcribe"):
        context = {"file": str(path), "window": window.index, "start_s": window.start_s}
        yield context, target.request(window.samples, language=language)


@contextmanager
def load_models(args, kind: type, what: str) -> Iterator[tuple[Decoder, dict[str, Any]]]:
    """The target and, per method, its drafter: a prefix-conditioned model for sd/specasr, a
    producer process for as2d (closed on exit)."""
    from asyncspec.models.registry import load_decoder

    # As²d's producer process spawns first and loads its model while the target loads
    producer = spawn_producer_early(args) if "as2d" in args.methods else None
    try:
        target = load_decoder(args.model, args.dtype, encoder=getattr(args, "encoder", "auto"))
        if not isinstance(target, kind):
            raise InputError(f"{args.model} is not a {what} model")
        drafters: dict[str, Any] = {}
        if needs_drafter(args.methods):
            drafter = load_decoder(args.drafter, args.dtype, engine="transformers")
            drafters.update(sd=drafter, specasr=drafter)
        if "as2d" in args.methods and producer is None:
            producer = start_producer(args, target)
        drafters["as2d"] = producer
        yield target, drafters
    finally:
        if producer is not None:
            producer.close()


def spawn_producer_early(args):
    """The producer for `args.model`, spawned before the target loads (its tokenizer read from the
    model's files); None when those files are not at hand (it then starts after the target)."""
    from pathlib import Path

    from asyncspec.models.registry import resolve_source
    from asyncspec.ondevice.producer import ProducerProcess

    try:
        tokenizer_file = Path(resolve_source(args.model)[0]) / "tokenizer.json"
    except (InputError, ModelNotPreparedError):
        return None  # the target's own load reports it
    if not tokenizer_file.is_file():
        return None
    spec = producer_spec(args.producer, args.chunk_s, args.producer_model, args.dtype, tokenizer_file.read_text())
    return ProducerProcess(spec, wait=False)


def start_producer(args, target: Decoder):
    return make_producer(args.producer, args.chunk_s, args.producer_model, args.dtype, target)


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


def decode_config(args) -> DecodeConfig:
    if args.budget is not None and args.budget < 1:
        raise InputError(f"--budget must be at least 1, got {args.budget}")
    if args.temperature < 0:
        raise InputError(f"--temperature must be >= 0, got {args.temperature}")
    as2d_budget = getattr(args, "as2d_budget", None)
    return DecodeConfig(temperature=args.temperature, seed=args.seed, budget=args.budget, as2d_budget=as2d_budget)


def run(args) -> int:
    windows = file_windows(args.audio)
    methods = methods_to_run(args.methods, args.compare)
    args.methods = methods
    config = decode_config(args)
    with load_models(args, WhisperBackend, "speech") as (target, drafters):
        jobs = window_jobs(target, windows, args.language)
        exactness = equality_check(target, config, args.compare)
        records = run_jobs(target, drafters, jobs, methods, config, args.json, args.trace, exactness)
    return print_summary(records, args.json, exactness)
