"""Target-decoupled producers: persistent worker processes (spawn) that read only the request's
audio and their own history, and publish immutable candidate batches in the target's vocabulary.

The worker is started and its model loaded once; a request's drafting starts when the request
arrives. After `start` the worker receives nothing from the target side until the target has
finished (then a `stop` so it does not keep drafting a finished request).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from asyncspec.audio import SAMPLE_RATE
from asyncspec.ondevice.buffer import CandidateBuffer, PublishedBatch
from asyncspec.ondevice.chunking import chunk_bounds

READY_TIMEOUT_S = 120.0
SILENT_CHUNK_PEAK = 1e-3
TOKENS_PER_SECOND_CAP = 8  # a chunk emits at most this many tokens per second of audio (+ slack)
HISTORY_TOKENS = 48  # own previous text given to the recogniser as context


@dataclass(frozen=True)
class ProducerSpec:
    kind: str = "ct2-chunk"  # the only kind so far: a recogniser over consecutive audio chunks
    model_dir: str = ""  # CTranslate2 Whisper directory (e.g. tiny.en as it ships)
    target_tokenizer_json: str = ""  # the target's tokenizer (JSON), for conversion into its vocabulary
    chunk_s: float = 2.56
    compute_type: str = "int8"
    threads: int = 1
    use_history: bool = True


class ChunkedWhisperSource:
    """CTranslate2 Whisper over consecutive chunks, each encoded at its real length and
    published atomically once recognised and converted."""

    name = "ct2-chunk"

    def __init__(self, spec: ProducerSpec):
        import ctranslate2
        import tokenizers
        from transformers import WhisperFeatureExtractor

        from asyncspec.models.tokenizer import TextTokenizer

        self.spec = spec
        self.ctranslate2 = ctranslate2
        self.model = ctranslate2.models.Whisper(
            spec.model_dir, device="cpu", compute_type=spec.compute_type, intra_threads=spec.threads
        )
        self.features = WhisperFeatureExtractor(feature_size=self.model.n_mels)
        self.own = TextTokenizer.from_file(os.path.join(spec.model_dir, "tokenizer.json"))
        self.target = TextTokenizer(tokenizers.Tokenizer.from_str(spec.target_tokenizer_json))
        token = self.own.token_id
        self.prompt = [token("<|startoftranscript|>")]
        if self.model.is_multilingual:
            self.prompt += [token("<|en|>"), token("<|transcribe|>")]
        self.prompt.append(token("<|notimestamps|>"))
        self.previous = token("<|startofprev|>")

    def run(self, request_id: int, audio: np.ndarray, publish: Callable, should_stop: Callable[[], bool]) -> None:
        offset, history = 0, []
        for start, end in chunk_bounds(audio, self.spec.chunk_s):
            if should_stop():
                return
            began = time.perf_counter()
            chunk = audio[start:end]
            if float(np.abs(chunk).max(initial=0.0)) < SILENT_CHUNK_PEAK:
                continue
            ids = self._recognise(chunk, history)
            history = (history + ids)[-HISTORY_TOKENS:]
            text = self.own.decode(ids)
            if offset and text and not text[0].isspace():
                text = " " + text
            tokens = tuple(self.target.encode(text))
            publish(PublishedBatch(request_id, self.name, offset, tokens, None, began, time.perf_counter()))
            offset += len(tokens)

    def _recognise(self, chunk: np.ndarray, history: list[int]) -> list[int]:
        mel = self.features(chunk, sampling_rate=SAMPLE_RATE, padding="longest", return_tensors="np").input_features
        mel = mel[..., : mel.shape[-1] - mel.shape[-1] % 2]  # the encoder's stride-2 convolution
        prompt = ([self.previous, *history] if self.spec.use_history and history else []) + self.prompt
        cap = int(len(chunk) / SAMPLE_RATE * TOKENS_PER_SECOND_CAP) + 8  # short chunks can loop
        features = self.ctranslate2.StorageView.from_array(np.ascontiguousarray(mel, dtype=np.float32))
        result = self.model.generate(features, [prompt], beam_size=1, max_length=cap)[0]
        return list(result.sequences_ids[0])


SOURCES = {"ct2-chunk": ChunkedWhisperSource}


def worker_main(spec: ProducerSpec, commands: Connection, batches: Connection) -> None:
    """The worker process: load once, then serve requests one at a time."""
    started = time.perf_counter()
    source = SOURCES[spec.kind](spec)
    batches.send(("ready", time.perf_counter() - started))
    while True:
        message = commands.recv()
        if message[0] == "close":
            return
        if message[0] != "start":
            continue  # a stop for a request that already finished
        _, request_id, audio = message
        received = [("start", time.perf_counter())]
        stopped = _stop_watcher(commands, request_id, received)
        source.run(request_id, audio, batches.send, stopped)
        batches.send(("done", request_id, time.perf_counter(), received))


def _stop_watcher(commands: Connection, request_id: int, received: list) -> Callable[[], bool]:
    """Polls for a stop of this request between chunks, logging every message received."""
    state = {"stopped": False}

    def stopped() -> bool:
        while not state["stopped"] and commands.poll(0):
            message = commands.recv()
            received.append((message[0], time.perf_counter()))
            state["stopped"] = message[0] in ("stop", "close") and (message[0] == "close" or message[1] == request_id)
        return state["stopped"]

    return stopped


class ProducerProcess:
    """The target side's handle on one persistent producer worker."""

    def __init__(self, spec: ProducerSpec):
        context = multiprocessing.get_context("spawn")
        self.spec = spec
        self._commands, worker_commands = context.Pipe(duplex=False)[::-1]
        worker_batches, self._batches = context.Pipe(duplex=False)[::-1]
        self.process = context.Process(
            target=worker_main, args=(spec, worker_commands, worker_batches), daemon=True, name=f"producer-{spec.kind}"
        )
        os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
        self.process.start()
        self.load_s = self._wait_ready()
        self._next_id = 0

    def _wait_ready(self) -> float:
        if not self._batches.poll(READY_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"producer {self.spec.kind} did not start within {READY_TIMEOUT_S:.0f} s")
        message = self._batches.recv()
        return message[1]

    def start(self, audio: np.ndarray) -> CandidateBuffer:
        """Begin drafting a request (call at its arrival); returns the buffer it publishes into."""
        if not self.process.is_alive():
            raise RuntimeError(f"producer {self.spec.kind} died (exit code {self.process.exitcode})")
        self._next_id += 1
        buffer = CandidateBuffer(self._next_id, self._batches)
        self._commands.send(("start", self._next_id, np.ascontiguousarray(audio, dtype=np.float32)))
        return buffer

    def finish(self, buffer: CandidateBuffer) -> None:
        """The target is done with the request: stop its drafting and drain what is left."""
        self._commands.send(("stop", buffer.request_id))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not buffer.finished and time.monotonic() < deadline:
            if self._batches.poll(0.5):
                buffer.accept(self._batches.recv())

    def close(self) -> None:
        if self.process.is_alive():
            self._commands.send(("close",))
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
