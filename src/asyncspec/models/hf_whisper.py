"""Whisper backend on Hugging Face-format weights: the encoder runs once per request in `prefill`;
the decoder runs on the fixed-shape engine (cross-attention K/V computed once per request), or on
transformers' own forward for a drafter (`engine="transformers"`). The fixed-shape engine loads
the weights into plain torch modules (whisper_model.py) and computes features in torch
(log_mel.py): transformers is imported only for the transformers engine."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncspec.errors import InputError
from asyncspec.models.attention_record import alignment_heads
from asyncspec.models.base import DecodeRequest, DecoderState
from asyncspec.models.encoder_placement import EncoderPlacement, place, place_encoder
from asyncspec.models.fixed_shape import CallShape, StaticKV
from asyncspec.models.forward_whisper import WhisperBlockForward
from asyncspec.models.int8_weights import weights_identity
from asyncspec.models.kv_backend import DEFAULT_WIDTH, FIXED_SHAPE, KVBackend
from asyncspec.models.log_mel import log_mel_tensor
from asyncspec.models.threads import torch_threads
from asyncspec.models.tokenizer import TextTokenizer
from asyncspec.models.whisper_model import keep_encoder_fp32, load_whisper
from asyncspec.models.whisper_rules import TimestampRules, apply_timestamp_rules

MULTILINGUAL_VOCAB = 51865
PREFILL_WIDTH = 128
TASKS = ("transcribe", "translate")


class WhisperBackend(KVBackend):
    def __init__(
        self,
        model: Any,  # whisper_model.WhisperModel, or transformers' WhisperForConditionalGeneration
        tokenizer: TextTokenizer,
        name: str,
        engine: str = FIXED_SHAPE,
        shape: CallShape | None = None,
        int8: bool = False,
        weights: dict | None = None,  # the model file's identity: its int8 weights are cached under it
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        config = model.config
        self.dtype = next(model.model.decoder.parameters()).dtype  # the encoder's is placed apart
        self.vocab_size = config.vocab_size
        self.multilingual = config.vocab_size >= MULTILINGUAL_VOCAB
        self.max_length = config.max_target_positions
        self.eos_ids = frozenset({tokenizer.token_id("<|endoftext|>")})
        self.mel_bins = config.num_mel_bins
        # The encoder runs once per request, before decoding. Its dtype and threads are chosen by
        # measurement (`load` places it; models/encoder_placement.py); built directly, it runs in
        # fp32 on the current threads. Its output is cast to the decoder's dtype.
        self.encoder_placement: EncoderPlacement | None = None
        model.model.encoder.float()
        suppress = _token_list(model, "suppress_tokens")
        begin = _token_list(model, "begin_suppress_tokens")
        self._suppress = _token_ids(self.vocab_size, suppress)
        self._suppress_begin = _token_ids(self.vocab_size, suppress + begin)
        self.timestamp_rules = _timestamp_rules(tokenizer)
        self.no_speech_id = _first_token(tokenizer, "<|nospeech|>", "<|nocaptions|>")
        # (layer, head) of the cross-attention heads word timestamps read; load() takes the model's own
        self.alignment_heads = alignment_heads(None, config.decoder_layers, config.decoder_attention_heads)
        self._init_engine(engine, shape, int8, weights)

    @classmethod
    def load(
        cls,
        source: str | Path,
        name: str,
        dtype: torch.dtype,
        engine: str = FIXED_SHAPE,
        encoder: str = "auto",
        int8: bool = False,
    ) -> WhisperBackend:
        local = Path(source) / "model.safetensors"
        model = load_whisper(source, dtype) if engine == FIXED_SHAPE and local.is_file() else _hf_model(source, dtype)
        tokenizer_file = Path(source) / "tokenizer.json"
        if tokenizer_file.exists():
            tokenizer = TextTokenizer.from_file(tokenizer_file)
        else:
            from transformers import AutoTokenizer

            tokenizer = TextTokenizer(AutoTokenizer.from_pretrained(str(source)).backend_tokenizer)
        backend = cls(model, tokenizer, name, engine=engine, int8=int8, weights=weights_identity(source))
        config = model.config
        backend.alignment_heads = alignment_heads(source, config.decoder_layers, config.decoder_attention_heads)
        backend.place_encoder(place_encoder(backend, encoder))
        return backend

    def place_encoder(self, placement: EncoderPlacement) -> None:
        self.encoder_placement = placement
        place(self.model.model.encoder, placement.dtype)

    def prompt_ids(
        self,
        language: str = "en",
        timestamps: bool = False,
        previous: Sequence[int] = (),
        task: str = "transcribe",
        hotwords: Sequence[int] = (),
    ) -> tuple[int, ...]:
        """[<|startofprev|> hotwords, previous text,] start of transcript, [language, task,] and
        <|notimestamps|> unless the window is decoded with timestamps. At most max_length // 2 - 1
        tokens of conditioning, as openai-whisper and faster-whisper keep of the previous text:
        the hotwords' first ones, then the last of the previous text in the room left. (faster-whisper
        allows that many of each; both together would leave a window almost no positions to decode.)
        task: "transcribe", or "translate" (to English; multilingual models only)."""
        token = self.tokenizer.token_id
        if task not in TASKS:
            raise InputError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        if task != "transcribe" and not self.multilingual:
            raise InputError(f"{self.name} is English-only: it cannot {task}")
        keep = self.max_length // 2 - 1
        hot = tuple(hotwords[:keep])
        room = keep - len(hot)
        tail = tuple(previous[-room:]) if room else ()
        head = (token("<|startofprev|>"), *hot, *tail) if hot or tail else ()
        start: tuple[int, ...] = (token("<|startoftranscript|>"),)
        if self.multilingual:
            if language not in self.languages:
                raise InputError(f"{self.name} has no language {language!r}")
            start += (self.languages[language], token(f"<|{task}|>"))
        elif language != "en":
            raise InputError(f"{self.name} is English-only, not {language!r}")
        return head + start + (() if timestamps else (self.timestamp_rules.no_timestamps,))

    @functools.cached_property
    def languages(self) -> dict[str, int]:
        """Language code -> its token: the ids between <|startoftranscript|> and <|translate|>."""
        if not self.multilingual:
            return {"en": -1}
        token, backend = self.tokenizer.token_id, self.tokenizer.backend
        first, end = token("<|startoftranscript|>") + 1, token("<|translate|>")
        return {backend.id_to_token(i)[2:-2]: i for i in range(first, end)}

    @torch.inference_mode()
    def detect_language(self, encoded: torch.Tensor) -> tuple[str, float, dict[str, float]]:
        """Whisper's language identification on one window's encoder output: the distribution over
        the language tokens of the row after <|startoftranscript|> (code, its probability, all)."""
        if not self.multilingual:
            return "en", 1.0, {"en": 1.0}
        state = self._new_state(1, encoded)
        (row,) = self.prefill_tokens(state, [self.tokenizer.token_id("<|startoftranscript|>")], 1, wanted=[0])
        codes, ids = zip(*self.languages.items(), strict=True)
        probs = torch.softmax(row[list(ids)].double(), dim=-1).tolist()
        everything = dict(zip(codes, probs, strict=True))
        best = max(everything, key=everything.__getitem__)
        return best, everything[best], everything

    def request(
        self,
        audio: np.ndarray,
        language: str = "en",
        max_new_tokens: int | None = None,
        timestamps: bool = False,
        previous: Sequence[int] = (),
        task: str = "transcribe",
        hotwords: Sequence[int] = (),
    ) -> DecodeRequest:
        prompt = self.prompt_ids(language, timestamps, previous, task, hotwords)
        room = self.max_length - len(prompt)
        return DecodeRequest(prompt_ids=prompt, audio=audio, max_new_tokens=min(max_new_tokens or room, room))

    @torch.inference_mode()
    def encode_audio(self, audio: np.ndarray, threads: int | None = None) -> torch.Tensor:
        """Encoder output [1, 1500, D] for at most 30 s of 16 kHz audio (padded as Whisper expects).
        `threads`: fewer threads than the placement's while a producer has a core, taken only where
        the placement found the encoder's output bitwise the same at that count."""
        features = log_mel_tensor(audio, self.mel_bins)
        placement = self.encoder_placement
        if placement is None:
            return self.model.model.encoder(features).last_hidden_state.to(self.dtype)
        with torch_threads(placement.threads_for(threads)):
            encoded = self.model.model.encoder(features.to(placement.torch_dtype)).last_hidden_state
        return encoded.to(self.dtype)

    def prefill(self, request: DecodeRequest, encoded: torch.Tensor | None = None) -> DecoderState:
        encoded = encoded if encoded is not None else request.encoded
        if encoded is None:
            if request.audio is None:
                raise ValueError("a Whisper request needs audio")
            encoded = self.encode_audio(request.audio)
        prompt = request.prompt_ids
        state = self._new_state(len(prompt), encoded)
        if request.attention is not None and request.attention.owner is self:
            self._record_attention(state, request.attention)
        state.extras["encoded"] = encoded
        state.extras["timestamps"] = self.timestamp_rules.no_timestamps not in prompt
        # Whisper's no-speech probability: the unmasked row after <|startoftranscript|>
        sot = prompt.index(self.tokenizer.token_id("<|startoftranscript|>"))
        (sot_row,) = self.prefill_tokens(state, prompt, len(prompt), wanted=[sot])
        state.extras["figures"] = {"no_speech_prob": float(torch.softmax(sot_row, dim=-1)[self.no_speech_id])}
        return state

    @property
    def backend(self) -> WhisperBackend:
        """This backend (also through a wrapper that forwards attributes, such as a cancellable one)."""
        return self

    def _record_attention(self, state: DecoderState, sink) -> None:
        """Word timestamps: the state's cache keeps its alignment heads' weights, and the sink the state."""
        from asyncspec.models.attention_record import AttentionRecord

        if not isinstance(state.cache, StaticKV):
            raise InputError("word timestamps need the fixed-shape engine")
        frames = self.model.config.max_source_positions
        state.cache.attention = AttentionRecord.empty(self.alignment_heads, state.cache.slots, frames)
        state.extras["attention_sink"] = sink
        sink.states.append(state)

    def probe_context(self) -> torch.Tensor:
        """A fixed pseudo-random encoder output [1, T, D] for the self-test (models/selftest.py)."""
        config = self.model.config
        generator = torch.Generator().manual_seed(99)
        return torch.randn(1, config.max_source_positions, config.d_model, generator=generator).to(self.dtype)

    def _default_shape(self) -> CallShape:
        # A long-form prompt carries up to 223 tokens of previous text: two blocks (128 rows and
        # the rest, fixed_shape.prefill_blocks). Its 226-row head took 178 ms in 32-row blocks
        # and 94 ms so (int8, two threads, capped to VNNI; bf16 uncapped 196 against 100), 2-core Zen 4.
        return CallShape(width=DEFAULT_WIDTH, prefill_width=PREFILL_WIDTH, capacity=self.max_length)

    def _block_forward(self, shape: CallShape) -> WhisperBlockForward:
        return WhisperBlockForward(self.model, block_rows=shape.width, integer_attention=self.precision == "int8")

    def _dynamic_cache(self) -> Any:
        from transformers import DynamicCache, EncoderDecoderCache

        config = copy.deepcopy(self.model.config)
        config.num_hidden_layers = config.decoder_layers
        return EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))

    def _hidden(self, state: DecoderState, ids: torch.Tensor) -> torch.Tensor:
        decoder = self.model.model.decoder
        encoded = state.extras["encoded"]
        return decoder(
            input_ids=ids, encoder_hidden_states=encoded, cache=state.cache, use_cache=True
        ).last_hidden_state

    def _output_weight(self) -> torch.Tensor:
        return self.model.proj_out.weight

    def _decoder_layers(self) -> torch.nn.Module:
        return self.model.model.decoder

    def _self_attention_cache(self, state: DecoderState):
        return state.cache.self_attention_cache

    def _apply_rules(self, state: DecoderState, tokens: list[int], logits: torch.Tensor) -> None:
        """Row i predicts position state.length + i + 1. Rows that predict an output token get the
        suppressed tokens (the first output position also the begin-suppression: no blank, no
        immediate end, as Whisper's reference decoder does) and, in a window decoded with
        timestamps, the timestamp rules over the output tokens before them. Rows inside the
        prompt stay raw (the no-speech probability is read from one)."""
        first_output_row = max(state.prompt_len - state.length - 1, 0)
        if first_output_row >= len(tokens):
            return
        rows = logits[first_output_row:]
        rows.index_fill_(1, self._suppress, float("-inf"))  # ~90 ids: not a pass over every row's vocabulary
        if first_output_row == state.prompt_len - state.length - 1:
            rows[0].index_fill_(0, self._suppress_begin, float("-inf"))
        if state.extras.get("timestamps"):
            sequence = state.tokens + tokens
            ends = range(state.length + first_output_row + 1, state.length + len(tokens) + 1)
            apply_timestamp_rules(self.timestamp_rules, rows, [sequence[state.prompt_len : end] for end in ends])


def _timestamp_rules(tokenizer: TextTokenizer) -> TimestampRules:
    no_timestamps = tokenizer.token_id("<|notimestamps|>")
    # English-only tokenizers may not list the timestamps: they follow <|notimestamps|>
    begin = _first_token(tokenizer, "<|0.00|>") if tokenizer.backend.token_to_id("<|0.00|>") else no_timestamps + 1
    return TimestampRules(timestamp_begin=begin, eot=tokenizer.token_id("<|endoftext|>"), no_timestamps=no_timestamps)


def _first_token(tokenizer: TextTokenizer, *names: str) -> int:
    for name in names:
        if tokenizer.backend.token_to_id(name) is not None:
            return tokenizer.token_id(name)
    raise KeyError(f"none of {names} is in the vocabulary")


def _hf_model(source: str | Path, dtype: torch.dtype) -> Any:
    """transformers' model, whose own forward the transformers engine runs (or a hub id's)."""
    from transformers import WhisperForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a local load of ~1 s: a progress bar is only noise on stderr
    return keep_encoder_fp32(WhisperForConditionalGeneration.from_pretrained(str(source), dtype=torch.float32), dtype)


def _token_list(model: Any, key: str) -> list[int]:
    value = getattr(model.generation_config, key, None) or getattr(model.config, key, None)
    return [int(t) for t in (value or [])]


def _token_ids(vocab: int, ids: list[int]) -> torch.Tensor:
    """The distinct ids within the vocabulary, long [n]."""
    return torch.tensor(sorted({i for i in ids if 0 <= i < vocab}), dtype=torch.long)
