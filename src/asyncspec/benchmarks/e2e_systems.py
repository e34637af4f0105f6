"""The systems `asyncspec bench e2e` times from audio file to text: asyncspec (target-only, As²d)
through the library path `asyncspec transcribe` uses, and faster-whisper (CTranslate2) on the same
Whisper weights, greedy, no VAD, the same 30 s windows.

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

from asyncspec.errors import InputError
from asyncspec.models.offline import REGISTRY, assemble_source, cache_root, package_file, prepare

FASTER_WHISPER_HINT = "pip install 'asyncspec[bench]'  (or: pip install faster-whisper==1.2.1)"
DIRECTORY_MARKER = "asyncspec-ct2.json"


def faster_whisper_installed() -> bool:
    return importlib.util.find_spec("faster_whisper") is not None


@dataclass
class Transcript:
    """One file's output. asyncspec's systems also give (request, token ids) per 30 s window, for
    the exactness check, and their seconds in prefill (features, encoder, prompt) and decode.
    A system that finds its own segments (whisper.cpp) gives them as (start s, end s, text)."""

    text: str
    windows: list = field(default_factory=list)
    segments: list = field(default_factory=list)
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
    """One decoding method over `asyncspec transcribe`'s path: read the file, split it into 30 s
    windows, one request per window (encoder, prefill, decode), the tokens as text."""

    def __init__(self, method: str, target, drafter, config, load_s: float, runahead: bool = True):
        self.method, self.target, self.drafter, self.config, self.load_s = method, target, drafter, config, load_s
        self.runahead = runahead and drafter is not None

    def settings(self) -> dict:
        producer = self.drafter.spec if self.drafter is not None else None
        from asyncspec.decoding.as2d import DEFAULT_BUDGET

        budget = self.config.budget_for("as2d", DEFAULT_BUDGET)
        as2d = {"producer": producer.kind, "chunk_s": producer.chunk_s, "budget": budget} if producer else {}
        as2d |= {"producer_runahead": self.runahead} if producer else {}
        return {"method": self.method, "dtype": str(self.target.dtype).removeprefix("torch.")} | as2d

    def transcribe(self, path: Path) -> Transcript:
        return self._decode(self._requests(path))

    def transcribe_files(self, paths: list[Path]) -> Iterator[Transcript]:
        """As a stream, As²d's requests arrive one file ahead: the next file is read while this one
        is decoded and its windows are queued on the producer, which drafts on into them as soon as
        it is done with this file's audio (it reads only audio, so no output changes)."""
        upcoming = self._requests(paths[0]) if paths else []
        for index in range(len(paths)):
            requests = upcoming
            upcoming = self._requests(paths[index + 1]) if index + 1 < len(paths) else []
            if self.runahead:
                self.drafter.arrive([request.audio for request in requests + upcoming])
            yield self._decode(requests)

    def _requests(self, path: Path) -> list:
        from asyncspec.run.windows import file_windows

        return [self.target.request(window.samples) for _, window in file_windows([str(path)])]

    def _decode(self, requests: list) -> Transcript:
        from asyncspec.decoding.methods import METHODS

        transcript = Transcript("")
        for request in requests:
            result = METHODS[self.method](self.target, self.drafter, request, self.config)
            transcript.windows.append((request, result.tokens))
            transcript.prefill_s += result.stats.prefill_s
            transcript.decode_s += result.stats.decode_s
        texts = (self.target.tokenizer.decode(tokens).strip() for _, tokens in transcript.windows)
        transcript.text = " ".join(texts).strip()
        return transcript

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()


class FasterWhisperSystem(StreamingSystem):
    """faster-whisper on the CTranslate2 files of `model`, greedy with no temperature fallback, no
    VAD, no timestamps and no conditioning on earlier windows: the settings asyncspec decodes with."""

    def __init__(self, model: str, compute_type: str, threads: int):
        from faster_whisper import WhisperModel

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
        return {"compute_type": self.model.model.compute_type, "cpu_threads": self.threads} | versions

    def transcribe(self, path: Path) -> Transcript:
        segments, _ = self.model.transcribe(
            str(path),
            language="en",
            beam_size=1,
            best_of=1,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
            # No quality checks: they only choose whether to fall back to sampling or drop a window.
            compression_ratio_threshold=None,
            log_prob_threshold=None,
            no_speech_threshold=None,
        )
        return Transcript(" ".join(segment.text.strip() for segment in segments).strip())

    def close(self) -> None:
        del self.model


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
