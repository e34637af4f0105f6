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
# Read speech runs at ~3-4 tokens per second; a higher cap only lets tiny.en loop at chunk ends.
TOKENS_PER_SECOND_CAP = 6
NO_REPEAT_NGRAM = 3  # real speech rarely repeats a trigram within a few seconds; tiny.en loops do
HISTORY_TOKENS = 48  # own previous text given to the recogniser as context
# Whisper's feature extractor pads each side by n_fft / 2 = 200 samples with reflection, which needs
# more input than that (a 10-sample file killed the producer); shorter chunks get zero padding.
MIN_CHUNK_SAMPLES = 401


@dataclass(frozen=True)
class ProducerSpec:
    kind: str = "ct2-chunk"  # "ct2-chunk" (recogniser over audio chunks) or "autoregressive"
    model_dir: str = ""  # ct2-chunk: CTranslate2 Whisper directory (e.g. tiny.en as it ships)
    drafter: str = "whisper-tiny.en"  # autoregressive: a transformers Whisper drafter
    dtype: str = "bf16"
    batch_tokens: int = 8  # autoregressive: publish after every this many drafter tokens
    target_tokenizer_json: str = ""  # the target's tokenizer (JSON), for conversion into its vocabulary
    chunk_s: float = 4.0  # measured here: 2.56 s chunks cut too many words for tiny.en
    compute_type: str = "int8"
    threads: int = 1
    use_history: bool = False  # tiny.en with its own previous text as prompt loops or goes silent (measured)


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
        chunk = np.pad(chunk, (0, max(0, MIN_CHUNK_SAMPLES - len(chunk))))
        mel = self.features(chunk, sampling_rate=SAMPLE_RATE, padding="longest", return_tensors="np").input_features
        mel = mel[..., : mel.shape[-1] - mel.shape[-1] % 2]  # the encoder's stride-2 convolution
        prompt = ([self.previous, *history] if self.spec.use_history and history else []) + self.prompt
        cap = int(len(chunk) / SAMPLE_RATE * TOKENS_PER_SECOND_CAP) + 6  # short chunks can loop
        features = self.ctranslate2.StorageView.from_array(np.ascontiguousarray(mel, dtype=np.float32))
        result = self.model.generate(
            features, [prompt], beam_size=1, max_length=cap, no_repeat_ngram_size=NO_REPEAT_NGRAM
        )[0]
        return list(result.sequences_ids[0])


class AutoregressiveWhisperSource:
    """A transformers Whisper drafter decoding the whole window from the audio and its own prefix,
    publishing every `batch_tokens` tokens the complete words it has so far (a word still being
    spelled could change its conversion), with each target token's drafter confidence."""

    name = "autoregressive"

    def __init__(self, spec: ProducerSpec):
        import tokenizers
        import torch

        from asyncspec.models.registry import load_decoder
        from asyncspec.models.tokenizer import TextTokenizer

        torch.set_num_threads(spec.threads)
        self.spec = spec
        self.drafter = load_decoder(spec.drafter, spec.dtype, engine="transformers")  # drafts need not be exact
        self.target = TextTokenizer(tokenizers.Tokenizer.from_str(spec.target_tokenizer_json))

    def run(self, request_id: int, audio: np.ndarray, publish: Callable, should_stop: Callable[[], bool]) -> None:
        import torch

        began = time.perf_counter()
        request = self.drafter.request(audio)
        state = self.drafter.prefill(request)
        ids, confidences, published = [], [], _Published(request_id, self.name)
        logits = state.next_logits
        while len(ids) < request.max_new_tokens and not should_stop():
            token = self.drafter.greedy(logits)[0]
            if token in self.drafter.eos_ids:
                break
            ids.append(token)
            confidences.append(float(torch.softmax(logits, dim=-1)[token]))
            if len(ids) % self.spec.batch_tokens == 0:
                began = published.flush(self, ids, confidences, began, publish, final=False)
            if state.length + 1 > self.drafter.max_length:
                break
            logits = self.drafter.extend(state, [token])[-1]
        published.flush(self, ids, confidences, began, publish, final=True)


class _Published:
    """What an autoregressive source has published so far: characters of its text and tokens."""

    def __init__(self, request_id: int, source: str):
        self.request_id, self.source, self.chars, self.offset = request_id, source, 0, 0

    def flush(self, owner, ids, confidences, began, publish, final: bool) -> float:
        text = owner.drafter.tokenizer.decode(ids)
        cut = len(text) if final else text.rfind(" ")  # up to the start of the word still open
        if cut <= self.chars:
            return began
        segment = text[self.chars : cut]
        tokens, token_confidences = _converted(owner, segment, self.chars, ids, confidences)
        publish(
            PublishedBatch(
                self.request_id, self.source, self.offset, tokens, token_confidences, began, time.perf_counter()
            )
        )
        self.chars, self.offset = cut, self.offset + len(tokens)
        return time.perf_counter()


def _converted(owner, segment: str, start: int, ids: list[int], confidences: list[float]):
    """Target tokens of a text segment, each with the lowest confidence of the drafter tokens it overlaps."""
    ends, text = [], ""
    for i in range(len(ids)):
        text = owner.drafter.tokenizer.decode(ids[: i + 1])
        ends.append(len(text))
    encoding = owner.target.backend.encode(segment, add_special_tokens=False)
    out = []
    for a, b in encoding.offsets:
        lo, hi = start + a, start + max(b, a + 1)
        spans = [c for c, end, prev in zip(confidences, ends, [0, *ends[:-1]], strict=True) if prev < hi and end > lo]
        out.append(min(spans) if spans else 1.0)
    return tuple(encoding.ids), tuple(out)


SOURCES = {"ct2-chunk": ChunkedWhisperSource, "autoregressive": AutoregressiveWhisperSource}


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
        try:
            source.run(request_id, audio, batches.send, stopped)
        except Exception as error:  # this request's input broke the source: report it, serve the next one
            batches.send(("failed", request_id, f"{type(error).__name__}: {error}"))
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
    """The target side's handle on one persistent producer worker.

    A producer is only ever a source of candidates the target verifies, so its failure costs speed,
    never correctness: a worker that errors on a request or dies leaves that request's buffer marked
    `failure` (the target decodes on alone, exactly as target-only), a dead worker is restarted at
    the next request, and both events are counted (`failures`, `restarts`)."""

    def __init__(self, spec: ProducerSpec, wait: bool = True):
        """`wait=False` returns once the worker is spawned, so it loads while the caller loads the
        target; the first `start` (or `ready`) then waits for it."""
        self.spec = spec
        self.failures = 0
        self.restarts = 0
        self._next_id = 0
        os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
        self.load_s = self._launch(wait)

    def _launch(self, wait: bool = True) -> float:
        context = multiprocessing.get_context("spawn")
        self._commands, worker_commands = context.Pipe(duplex=False)[::-1]
        worker_batches, self._batches = context.Pipe(duplex=False)[::-1]
        self.process = context.Process(
            target=worker_main,
            args=(self.spec, worker_commands, worker_batches),
            daemon=True,
            name=f"producer-{self.spec.kind}",
        )
        self.process.start()
        self._ready = False
        return self.ready() if wait else 0.0

    def ready(self) -> float:
        """Wait until the worker has loaded its model; its load seconds."""
        if not self._ready:
            self.load_s = self._wait_ready()
            self._ready = True
        return self.load_s

    def _wait_ready(self) -> float:
        try:
            if self._batches.poll(READY_TIMEOUT_S):
                return self._batches.recv()[1]
        except (EOFError, OSError):
            pass  # the worker died while loading
        self.close()
        raise RuntimeError(f"producer {self.spec.kind} did not start (exit code {self.process.exitcode})")

    def start(self, audio: np.ndarray) -> CandidateBuffer:
        """Begin drafting a request (call at its arrival); returns the buffer it publishes into.
        Never raises: a producer that cannot draft yields a buffer marked failed (target-only)."""
        self._next_id += 1
        buffer = CandidateBuffer(self._next_id, self._batches)
        try:
            if not self.process.is_alive():
                self._restart()
                buffer.channel = self._batches
            self.ready()  # its ready message must be read before any batch
            self._commands.send(("start", self._next_id, np.ascontiguousarray(audio, dtype=np.float32)))
        except (RuntimeError, OSError, EOFError) as error:
            self._failed(buffer, f"the producer could not start drafting: {error}")
        return buffer

    def _restart(self) -> None:
        self.restarts += 1
        self.close()
        self.load_s = self._launch()

    def _failed(self, buffer: CandidateBuffer, reason: str) -> None:
        self.failures += 1
        buffer.fail(reason)

    def finish(self, buffer: CandidateBuffer) -> None:
        """The target is done with the request: stop its drafting and drain what is left."""
        if buffer.finished:
            self.failures += buffer.failure is not None
            return
        try:
            self._commands.send(("stop", buffer.request_id))
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not buffer.finished and time.monotonic() < deadline:
                if self._batches.poll(0.5):
                    buffer.accept(self._batches.recv())
                elif not self.process.is_alive():
                    raise EOFError("the producer process exited")
        except (EOFError, OSError) as error:
            buffer.fail(f"the producer died ({type(error).__name__}: {error}; exit code {self.process.exitcode})")
        self.failures += buffer.failure is not None

    def close(self) -> None:
        try:
            if self.process.is_alive():
                self._commands.send(("close",))
                self.process.join(timeout=10)
        except OSError:
            pass  # the pipe is already broken: the worker is gone or going
        if self.process.is_alive():
            self.process.kill()
