"""The systems `asyncspec bench e2e` times from audio file to text: asyncspec (target-only, As²d)
through the library path `asyncspec transcribe` uses, and faster-whisper (CTranslate2) on the same
Whisper weights under a named preset (`FASTER_WHISPER_PRESETS`): its own long-form algorithm
greedy, its transcribe defaults (beam 5), or stripped to asyncspec's blind 30 s windows.

asyncspec's cache holds the transformers conversion of the weights; faster-whisper reads the
CTranslate2 files as they ship. They go into a derived directory beside the prepared models
(`<cache>/ct2/<name>`): the joined model.bin (its SHA-256 checked), its config, the tokenizer and a
vocabulary.json built from that tokenizer in id order. The prepared model itself is never changed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from asyncspec.errors import InputError
from asyncspec.models.offline import REGISTRY, assemble_source, cache_root, package_file, prepare

FASTER_WHISPER_HINT = "pip install 'asyncspec[bench]'  (or: pip install faster-whisper==1.2.1)"
DIRECTORY_MARKER = "asyncspec-ct2.json"

# What each preset passes to WhisperModel.transcribe; every other argument keeps faster-whisper's
# default (see faster_whisper_settings). language="en" in all: no detection pass, English audio.
FASTER_WHISPER_PRESETS: dict[str, dict] = {
    # Its long-form algorithm (timestamps, seek, previous-text conditioning, temperature fallback,
    # its thresholds) with greedy search: only beam_size differs from its defaults. best_of keeps its
    # default 5, the number of samples asyncspec draws at a fallback temperature too (until
    # 2026-12-02 it was 1 here: five samples against one on every window that fell back).
    "greedy": {"language": "en", "beam_size": 1},
    # Its transcribe defaults as a user who sets nothing gets them: beam search of 5.
    "default": {"language": "en"},
    # The settings asyncspec decoded with before its long-form algorithm: greedy, no timestamps,
    # no conditioning, no fallback, no checks (they only choose whether to fall back or drop a
    # window), each 30 s window cut blind. It drops speech on long files; kept for the short-file
    # figures measured with it.
    "stripped": {
        "language": "en",
        "beam_size": 1,
        "best_of": 1,
        "temperature": 0.0,
        "condition_on_previous_text": False,
        "without_timestamps": True,
        "vad_filter": False,
        "compression_ratio_threshold": None,
        "log_prob_threshold": None,
        "no_speech_threshold": None,
    },
}
# BatchedInferencePipeline as its users run it: its own defaults (beam 5, Silero VAD cutting the
# recording into chunks of up to 30 s at pauses, no timestamps), batch_size 8 as its README shows.
FASTER_WHISPER_PRESETS["batched"] = {"language": "en", "batch_size": 8}
BATCHED_PRESETS = frozenset({"batched"})  # run through BatchedInferencePipeline, not WhisperModel.transcribe
# The names: faster-whisper's long-form settings greedy, and its defaults.
PRESET_NAMES = {"longform-greedy": "greedy", "defaults": "default"}
# asyncspec's systems: name -> (decoding method, long-form options over the library's defaults, the
# same as `asyncspec transcribe` flags). beam5 is faster-whisper's default search (every method
# decodes a beam search target-only); batched is BatchedInferencePipeline's batch of 8.
ASYNCSPEC_VARIANTS: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "target": ("target", {}, ()),
    "as2d": ("as2d", {}, ()),
    "beam5": ("target", {"beam_size": 5}, ("--beam-size", "5")),
    "batched": ("target", {"batch_size": 8}, ("--batch-size", "8")),
}


def faster_whisper_installed() -> bool:
    return importlib.util.find_spec("faster_whisper") is not None


class Segment(NamedTuple):
    start: float  # seconds into the file
    end: float
    text: str


@dataclass
class Transcript:
    """One file's output and its segments. asyncspec's systems also give the transcription's info
    (every window's request and tokens, for the exactness check) and their seconds in prefill
    (features, encoder, prompt) and decode."""

    text: str
    segments: list[Segment] = field(default_factory=list)
    info: Any = None
    prefill_s: float = 0.0
    decode_s: float = 0.0


class StreamingSystem:
    """A system transcribes the benchmark's files as one stream, in order, so that a path that
    overlaps one file's decode with the next file's preparation gets the credit in the total."""

    warmup_s = 0.0

    def settings(self) -> dict:
        """What the JSON records of how this system ran."""
        return {}

    def transcribe(self, path: Path) -> Transcript:
        raise NotImplementedError

    def transcribe_files(self, paths: list[Path]) -> Iterator[Transcript]:
        for path in paths:
            yield self.transcribe(path)


class AsyncspecSystem(StreamingSystem):
    """One decoding method through the library API (`asyncspec.Transcriber`), the path `asyncspec
    transcribe` takes: Whisper's long-form algorithm over the whole file. The transcriber (target,
    producer) is shared by target-only and As²d and closed by the benchmark."""

    def __init__(self, name: str, transcriber, load_s: float):
        self.method, self.options, _ = ASYNCSPEC_VARIANTS[name]
        self.transcriber, self.load_s = transcriber, load_s

    def settings(self) -> dict:
        from dataclasses import asdict

        from asyncspec.decoding.as2d import DEFAULT_BUDGET
        from asyncspec.transcription.longform import LongformOptions

        target = self.transcriber.target
        settings: dict[str, Any] = {"method": self.method, "dtype": target.precision}
        settings["longform"] = asdict(LongformOptions(language="en", **self.options))
        if self.method == "as2d":
            producer = self.transcriber.producer.spec
            budget = self.transcriber.budget or self.transcriber.as2d_budget or DEFAULT_BUDGET
            settings |= {"producer": producer.kind, "chunk_s": producer.chunk_s, "budget": budget}
        return settings

    def transcribe(self, path: Path) -> Transcript:
        # language="en": as every system
        segments, info = self.transcriber.transcribe(path, method=self.method, language="en", **self.options)
        spans = [Segment(s.start, s.end, s.text.strip()) for s in segments]
        text = " ".join(span.text for span in spans).strip()
        return Transcript(text, segments=spans, info=info, prefill_s=info.stats.prefill_s, decode_s=info.stats.decode_s)

    def close(self) -> None:
        pass  # the shared transcriber is closed once, by the benchmark


class FasterWhisperSystem(StreamingSystem):
    """faster-whisper on the CTranslate2 files of `model`, no VAD, under one of
    FASTER_WHISPER_PRESETS ("greedy", "default", "stripped"; or a PRESET_NAMES alias)."""

    def __init__(self, model: str, compute_type: str, threads: int, preset: str = "stripped"):
        from faster_whisper import WhisperModel

        self.preset = PRESET_NAMES.get(preset, preset)
        if self.preset not in FASTER_WHISPER_PRESETS:
            raise InputError(
                f"unknown faster-whisper preset {preset!r}; choose from {', '.join(FASTER_WHISPER_PRESETS)}"
            )
        directory = ct2_directory(model)
        started = time.perf_counter()
        self.model = WhisperModel(str(directory), device="cpu", compute_type=compute_type, cpu_threads=threads)
        self.load_s = time.perf_counter() - started
        self.threads = threads

    def settings(self) -> dict:
        import ctranslate2
        import faster_whisper

        versions = {"faster_whisper": faster_whisper.__version__, "ctranslate2": ctranslate2.__version__}
        # CTranslate2 names the type it actually runs (int8 runs as int8_float32 on this CPU).
        ran = {"compute_type": self.model.model.compute_type, "cpu_threads": self.threads, "preset": self.preset}
        return ran | {"transcribe": faster_whisper_settings(self.preset)} | versions

    def transcribe(self, path: Path) -> Transcript:
        from faster_whisper import BatchedInferencePipeline

        pipeline = BatchedInferencePipeline(self.model) if self.preset in BATCHED_PRESETS else self.model
        segments, _ = pipeline.transcribe(str(path), **FASTER_WHISPER_PRESETS[self.preset])
        found = [Segment(round(s.start, 3), round(s.end, 3), s.text.strip()) for s in segments]
        return Transcript(" ".join(s.text for s in found).strip(), segments=found)

    def close(self) -> None:
        del self.model


def faster_whisper_settings(preset: str) -> dict:
    """Every transcribe argument a preset runs with: its own, over faster-whisper's defaults as
    this installed version declares them (so a record shows the thresholds that applied)."""
    import inspect

    from faster_whisper import BatchedInferencePipeline, WhisperModel

    preset = PRESET_NAMES.get(preset, preset)
    entry = BatchedInferencePipeline.transcribe if preset in BATCHED_PRESETS else WhisperModel.transcribe
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(entry).parameters.items()
        if parameter.default is not inspect.Parameter.empty and _plain(parameter.default)
    }
    return defaults | FASTER_WHISPER_PRESETS[preset]


def _plain(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, list, tuple))


def ct2_directory(name: str) -> Path:
    """The complete CTranslate2 directory of a registered Whisper model, built on first use."""
    model = REGISTRY.get(name)
    if model is None or model.source_format != "ct2-whisper":
        raise InputError(f"{name}: no CTranslate2 weights ship for it")
    directory = cache_root() / "ct2" / name
    if (directory / DIRECTORY_MARKER).is_file():
        return directory
    work = directory.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _write_ct2_files(name, work)
        shutil.rmtree(directory, ignore_errors=True)
        work.rename(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return directory


def _write_ct2_files(name: str, out: Path) -> None:
    model = REGISTRY[name]
    assemble_source(name, out / "model.bin")
    for package, relative in model.side_files:  # the shipped CT2 config.json and tokenizer.json
        shutil.copy(package_file(package, relative), out / Path(relative).name)
    (out / "vocabulary.json").write_text(json.dumps(vocabulary(out / "tokenizer.json")))
    # faster-whisper's feature extractor: the mel bins of these weights (80 for base), Whisper's framing.
    mel_bins = json.loads((prepare(name, log=lambda _: None) / "config.json").read_text())["num_mel_bins"]
    preprocessor = {"feature_size": mel_bins, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30}
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor | {"n_fft": 400}))
    (out / DIRECTORY_MARKER).write_text(json.dumps({"name": name, "source_sha256": model.sha256}))


def vocabulary(tokenizer_json: Path) -> list[str]:
    """Every token of the tokenizer, added tokens included, in id order (CTranslate2's vocabulary)."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size(with_added_tokens=True))]
    if any(token is None for token in tokens):
        raise InputError(f"{tokenizer_json}: the token ids are not contiguous")
    return tokens
