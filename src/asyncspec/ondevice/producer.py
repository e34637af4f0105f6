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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from asyncspec.audio import SAMPLE_RATE
from asyncspec.ondevice.buffer import CandidateBuffer, PublishedBatch
from asyncspec.ondevice.chunking import chunk_bounds
from asyncspec.ondevice.messages import Close, Command, Done, Failed, Ready, Start, Stop

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
        offset, history = 0, list[int]()
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
        request = self.drafter.request(audio)  # type: ignore[attr-defined]  # a Whisper backend
        state = self.drafter.prefill(request)
        ids, confidences, published = list[int](), list[float](), _Published(request_id, self.name)
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


SOURCES: dict[str, type] = {"ct2-chunk": ChunkedWhisperSource, "autoregressive": AutoregressiveWhisperSource}


def worker_main(spec: ProducerSpec, commands: Connection, batches: Connection) -> None:
    """The worker process: load once, then draft requests one at a time in arrival order. Starts
    that arrive while a request is drafted queue behind it, so the worker runs ahead through every
    request that has arrived (it reads only their audio) instead of idling until the target asks."""
    started = time.perf_counter()
    source = SOURCES[spec.kind](spec)
    batches.send(Ready(time.perf_counter() - started))
    inbox = _Inbox(commands, batches)
    while (start := inbox.next_start()) is not None:
        received = [("start", time.perf_counter())]
        try:
            source.run(start.request_id, start.audio, batches.send, inbox.stop_watcher(start.request_id, received))
        except Exception as error:  # this request's input broke the source: report it, serve the next one
            batches.send(Failed(start.request_id, f"{type(error).__name__}: {error}"))
        batches.send(Done(start.request_id, time.perf_counter(), tuple(received)))


class _Inbox:
    """The worker's view of its command pipe: queued starts, stops of requests not yet begun, close."""

    def __init__(self, commands: Connection, batches: Connection):
        self.commands, self.batches = commands, batches
        self.queued: deque[Start] = deque()
        self.closed = False

    def next_start(self) -> Start | None:
        """The next request to draft, waiting for one; None once the worker is closed."""
        while not self.closed:
            if self.queued:
                return self.queued.popleft()
            self._take(self.commands.recv())
        return None

    def _take(self, message: Command) -> None:
        if isinstance(message, Close):
            self.closed = True
        elif isinstance(message, Start):
            self.queued.append(message)
        elif isinstance(message, Stop):
            self._skip(message.request_id)  # a stop for a finished request needs nothing

    def _skip(self, request_id: int) -> None:
        """A request stopped before its drafting began is done at once, its audio never read."""
        waiting = [s for s in self.queued if s.request_id == request_id]
        for start in waiting:
            self.queued.remove(start)
            self.batches.send(Done(request_id, time.perf_counter(), ()))

    def stop_watcher(self, request_id: int, received: list) -> Callable[[], bool]:
        """Polled between chunks: whether this request was stopped (or the worker closed). Every
        command that concerns this request is logged with its time (the decoupling test reads the
        log: nothing may reach the worker about a request before the target has finished it);
        starts of later requests queue, stops of them skip them."""
        state = {"stopped": False}

        def stopped() -> bool:
            while not self.closed and not state["stopped"] and self.commands.poll(0):
                message = self.commands.recv()
                if getattr(message, "request_id", request_id) == request_id:
                    received.append((type(message).__name__.lower(), time.perf_counter()))
                if isinstance(message, Stop) and message.request_id == request_id:
                    state["stopped"] = True
                else:
                    self._take(message)
            return self.closed or state["stopped"]

        return stopped


class _Demux:
    """The target side of the worker's one batch pipe, split per request: whichever buffer drains
    the pipe routes every message to its own request's queue, so batches a producer published ahead
    for later requests wait for them instead of being dropped."""

    def __init__(self, pipe: Connection):
        self.pipe = pipe
        self.queues: dict[int, deque] = {}

    def channel(self, request_id: int) -> _RequestChannel:
        self.queues.setdefault(request_id, deque())
        return _RequestChannel(self, request_id)

    def drain(self) -> None:
        while self.pipe.poll(0):
            message = self.pipe.recv()
            queue = self.queues.get(getattr(message, "request_id", None))
            if queue is not None:  # a message of a request already finished and forgotten is dropped
                queue.append(message)

    def forget(self, request_id: int) -> None:
        self.queues.pop(request_id, None)


class _RequestChannel:
    """One request's queue, with the `poll`/`recv` a CandidateBuffer reads."""

    def __init__(self, demux: _Demux, request_id: int):
        self.demux, self.request_id = demux, request_id

    def poll(self, timeout: float = 0.0) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.demux.drain()
            if self.demux.queues.get(self.request_id):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.demux.pipe.poll(min(remaining, 0.05))

    def recv(self) -> object:
        return self.demux.queues[self.request_id].popleft()


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
        self._arrived: dict[int, tuple[np.ndarray, CandidateBuffer]] = {}  # id(audio) -> announced, not started
        os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
        self.load_s = self._launch(wait)

    def _launch(self, wait: bool = True) -> float:
        context = multiprocessing.get_context("spawn")
        self._commands, worker_commands = context.Pipe(duplex=False)[::-1]
        worker_batches, self._batches = context.Pipe(duplex=False)[::-1]
        self._demux = _Demux(self._batches)
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
                message = self._batches.recv()
                if isinstance(message, Ready):
                    return message.load_s
        except (EOFError, OSError):
            pass  # the worker died while loading
        self.close()
        raise RuntimeError(f"producer {self.spec.kind} did not start (exit code {self.process.exitcode})")

    def arrive(self, audios: list[np.ndarray]) -> None:
        """Requests have arrived that the target will decode later, in this order: their drafting
        is queued now, so the worker runs on into them while the target is still busy with earlier
        ones. `start` with the same audio object then returns the buffer already filling."""
        for audio in audios:
            if id(audio) not in self._arrived:
                self._arrived[id(audio)] = (audio, self._begin(audio))

    def start(self, audio: np.ndarray) -> CandidateBuffer:
        """Begin drafting a request (call at its arrival); returns the buffer it publishes into.
        Never raises: a producer that cannot draft yields a buffer marked failed (target-only)."""
        arrived = self._arrived.pop(id(audio), None)
        return arrived[1] if arrived is not None else self._begin(audio)

    def _begin(self, audio: np.ndarray) -> CandidateBuffer:
        self._next_id += 1
        buffer = CandidateBuffer(self._next_id)
        try:
            if not self.process.is_alive():
                self._restart()
            self.ready()  # its ready message must be read before any batch
            self._send_start(buffer, audio)
        except (RuntimeError, OSError, EOFError) as error:
            self._failed(buffer, f"the producer could not start drafting: {error}")
        return buffer

    def _send_start(self, buffer: CandidateBuffer, audio: np.ndarray) -> None:
        buffer.channel = self._demux.channel(buffer.request_id)
        self._commands.send(Start(buffer.request_id, np.ascontiguousarray(audio, dtype=np.float32)))

    def _restart(self) -> None:
        """A fresh worker; requests that arrived but were not started yet are queued on it again."""
        self.restarts += 1
        self.close()
        self.load_s = self._launch()
        for audio, buffer in self._arrived.values():
            if not buffer.finished:
                self._send_start(buffer, audio)

    def _failed(self, buffer: CandidateBuffer, reason: str) -> None:
        self.failures += 1
        buffer.fail(reason)

    def finish(self, buffer: CandidateBuffer) -> None:
        """The target is done with the request: stop its drafting and drain what is left."""
        if not buffer.finished:
            self._stop_and_drain(buffer)
        if buffer.channel is not None:
            self._demux.forget(buffer.request_id)
        self.failures += buffer.failure is not None

    def _stop_and_drain(self, buffer: CandidateBuffer) -> None:
        try:
            self._commands.send(Stop(buffer.request_id))
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not buffer.finished and time.monotonic() < deadline:
                if buffer.channel.poll(0.5):
                    buffer.accept(buffer.channel.recv())
                elif not self.process.is_alive():
                    raise EOFError("the producer process exited")
        except (EOFError, OSError) as error:
            buffer.fail(f"the producer died ({type(error).__name__}: {error}; exit code {self.process.exitcode})")

    def close(self) -> None:
        try:
            if self.process.is_alive():
                self._commands.send(Close())
                self.process.join(timeout=10)
        except OSError:
            pass  # the pipe is already broken: the worker is gone or going
        if self.process.is_alive():
            self.process.kill()
