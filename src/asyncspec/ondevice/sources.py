"""What a producer drafts with: a recogniser over the request's audio, publishing immutable
candidate batches in the target's vocabulary. Each source reads only the audio and its own output
(the decoupling invariant); the worker process around it is `producer.py`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from asyncspec.audio import SAMPLE_RATE
from asyncspec.models.log_mel import log_mel
from asyncspec.ondevice.buffer import PublishedBatch
from asyncspec.ondevice.chunking import chunk_bounds

SILENT_CHUNK_PEAK = 1e-3
# Read speech runs at ~3-4 tokens per second; a higher cap only lets tiny.en loop at chunk ends.
TOKENS_PER_SECOND_CAP = 6
NO_REPEAT_NGRAM = 3  # real speech rarely repeats a trigram within a few seconds; tiny.en loops do
HISTORY_TOKENS = 48  # own previous text given to the recogniser as context
# Whisper's feature extractor pads each side by n_fft / 2 = 200 samples with reflection, which needs
# more input than that (a 10-sample file killed the producer); shorter chunks get zero padding.
MIN_CHUNK_SAMPLES = 401
# chunks recognised in one batched call (without history prompts, they are independent): measured
# with tiny.en int8 on one EPYC thread over a 161 s recording, 3.6 s one at a time, 2.0 s four at a
# time (its first 30 s published after 0.41 s instead of 0.74 s), 2.2 s eight at a time
CHUNKS_PER_CALL = 4


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

        from asyncspec.models.tokenizer import TextTokenizer

        self.spec = spec
        self.ctranslate2 = ctranslate2
        self.model = ctranslate2.models.Whisper(
            spec.model_dir, device="cpu", compute_type=spec.compute_type, intra_threads=spec.threads
        )
        self.mel_bins = self.model.n_mels
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
        for group in self._groups(audio):
            if should_stop():
                return
            began = time.perf_counter()
            recognised = self._recognise([audio[start:end] for start, end in group], history)
            for (start, end), ids in zip(group, recognised, strict=True):
                history = (history + ids)[-HISTORY_TOKENS:]
                text = self.own.decode(ids)
                if offset and text and not text[0].isspace():
                    text = " " + text
                tokens = tuple(self.target.encode(text))
                start_s, end_s = start / SAMPLE_RATE, end / SAMPLE_RATE
                publish(
                    PublishedBatch(
                        request_id, self.name, offset, tokens, None, began, time.perf_counter(), start_s, end_s
                    )
                )
                offset += len(tokens)

    def steady_load(self, audio: np.ndarray, should_stop: Callable[[], bool]) -> None:
        """What this producer does beside a verifying target, again and again until told to stop:
        natively it encodes and recognises chunk after chunk while the target verifies."""
        while not should_stop():
            self.run(0, audio, lambda batch: None, should_stop)

    def _groups(self, audio: np.ndarray) -> list[list[tuple[int, int]]]:
        """The audible chunks, CHUNKS_PER_CALL to a recogniser call (one where each is prompted
        with the text before it)."""
        size = 1 if self.spec.use_history else CHUNKS_PER_CALL
        audible = [
            (start, end)
            for start, end in chunk_bounds(audio, self.spec.chunk_s)
            if float(np.abs(audio[start:end]).max(initial=0.0)) >= SILENT_CHUNK_PEAK
        ]
        return [audible[i : i + size] for i in range(0, len(audible), size)]

    def _recognise(self, chunks: list[np.ndarray], history: list[int]) -> list[list[int]]:
        """One batched call over chunks padded with silence to the longest (at least MIN_CHUNK_SAMPLES)."""
        longest = max(MIN_CHUNK_SAMPLES, *(len(chunk) for chunk in chunks))
        mels = []
        for chunk in chunks:
            mel = log_mel(np.pad(chunk, (0, longest - len(chunk))), self.mel_bins, pad_to=None)
            mels.append(mel[..., : mel.shape[-1] - mel.shape[-1] % 2])  # the encoder's stride-2 convolution
        prompt = ([self.previous, *history] if self.spec.use_history and history else []) + self.prompt
        cap = int(longest / SAMPLE_RATE * TOKENS_PER_SECOND_CAP) + 6  # short chunks can loop
        features = np.ascontiguousarray(np.concatenate([mel.reshape(1, *mel.shape[-2:]) for mel in mels]))
        results = self.model.generate(
            self.ctranslate2.StorageView.from_array(features.astype(np.float32, copy=False)),
            [prompt] * len(chunks),
            beam_size=1,
            max_length=cap,
            no_repeat_ngram_size=NO_REPEAT_NGRAM,
        )
        return [list(result.sequences_ids[0]) for result in results]


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
        began = time.perf_counter()
        request = self.drafter.request(audio)  # type: ignore[attr-defined]  # a Whisper backend
        state = self.drafter.prefill(request)
        self._draft(request_id, request, state, state.next_logits, began, publish, should_stop)

    def steady_load(self, audio: np.ndarray, should_stop: Callable[[], bool]) -> None:
        """What this producer does beside a verifying target, again and again until told to stop:
        drafting, not encoding. Natively its encoder (tiny.en) runs while the target's larger one
        encodes the same window, and its first batch is out before the first verification (the
        120 validation trajectories, 2-core EPYC 2026-12-04: 0.17–0.73 s before), so the window
        is encoded once here."""
        request = self.drafter.request(audio)  # type: ignore[attr-defined]  # a Whisper backend
        state = self.drafter.prefill(request)
        prompt_length, first = state.length, state.next_logits
        while not should_stop():
            self._draft(0, request, state, first, time.perf_counter(), lambda batch: None, should_stop)
            self.drafter.rollback(state, prompt_length)

    def _draft(self, request_id, request, state, logits, began: float, publish, should_stop) -> None:
        """Greedy drafting from the prefilled state, publishing as `run` describes."""
        import torch

        ids, confidences, published = list[int](), list[float](), _Published(request_id, self.name)
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
