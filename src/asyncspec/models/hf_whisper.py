"""Whisper backend on transformers weights: the encoder runs once per request in `prefill`; the
decoder runs on the fixed-shape engine (cross-attention K/V computed once per request), or on
transformers' own forward for a drafter (`engine="transformers"`)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoTokenizer,
    DynamicCache,
    EncoderDecoderCache,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
)

from asyncspec.audio import SAMPLE_RATE
from asyncspec.errors import InputError
from asyncspec.models.base import DecodeRequest, DecoderState
from asyncspec.models.encoder_placement import EncoderPlacement, place_encoder
from asyncspec.models.fixed_shape import CallShape
from asyncspec.models.forward_whisper import WhisperBlockForward
from asyncspec.models.kv_backend import DEFAULT_WIDTH, FIXED_SHAPE, KVBackend
from asyncspec.models.tokenizer import TextTokenizer

MULTILINGUAL_VOCAB = 51865


class WhisperBackend(KVBackend):
    def __init__(
        self,
        model: WhisperForConditionalGeneration,
        tokenizer: TextTokenizer,
        name: str,
        engine: str = FIXED_SHAPE,
        shape: CallShape | None = None,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        config = model.config
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = config.vocab_size
        self.multilingual = config.vocab_size >= MULTILINGUAL_VOCAB
        self.max_length = config.max_target_positions
        self.eos_ids = frozenset({tokenizer.token_id("<|endoftext|>")})
        self.features = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
        # The encoder runs once per request, before decoding. Its dtype and threads are chosen by
        # measurement (`load` places it; models/encoder_placement.py); built directly, it runs in
        # fp32 on the current threads. Its output is cast to the decoder's dtype.
        self.encoder_placement: EncoderPlacement | None = None
        model.model.encoder.float()
        self._cache_config = copy.deepcopy(config)
        self._cache_config.num_hidden_layers = config.decoder_layers
        suppress = _token_list(model, "suppress_tokens")
        begin = _token_list(model, "begin_suppress_tokens")
        self._suppress = _mask(self.vocab_size, suppress)
        self._suppress_begin = _mask(self.vocab_size, suppress + begin)
        self._init_engine(engine, shape)

    @classmethod
    def load(
        cls, source: str | Path, name: str, dtype: torch.dtype, engine: str = FIXED_SHAPE, encoder: str = "auto"
    ) -> WhisperBackend:
        model = WhisperForConditionalGeneration.from_pretrained(str(source), dtype=dtype)
        tokenizer_file = Path(source) / "tokenizer.json"
        if tokenizer_file.exists():
            tokenizer = TextTokenizer.from_file(tokenizer_file)
        else:
            tokenizer = TextTokenizer(AutoTokenizer.from_pretrained(str(source)).backend_tokenizer)
        backend = cls(model, tokenizer, name, engine=engine)
        backend.place_encoder(place_encoder(backend, encoder))
        return backend

    def place_encoder(self, placement: EncoderPlacement) -> None:
        self.encoder_placement = placement
        self.model.model.encoder.to(placement.torch_dtype)

    def prompt_ids(self, language: str = "en") -> tuple[int, ...]:
        """Start of transcript, [language, transcribe,] no timestamps."""
        token = self.tokenizer.token_id
        if not self.multilingual:
            return (token("<|startoftranscript|>"), token("<|notimestamps|>"))
        try:
            lang = token(f"<|{language}|>")
        except KeyError:
            raise InputError(f"{self.name} has no language {language!r}") from None
        return (token("<|startoftranscript|>"), lang, token("<|transcribe|>"), token("<|notimestamps|>"))

    def request(self, audio: np.ndarray, language: str = "en", max_new_tokens: int | None = None) -> DecodeRequest:
        prompt = self.prompt_ids(language)
        room = self.max_length - len(prompt)
        return DecodeRequest(prompt_ids=prompt, audio=audio, max_new_tokens=min(max_new_tokens or room, room))

    @torch.inference_mode()
    def encode_audio(self, audio: np.ndarray) -> torch.Tensor:
        """Encoder output [1, 1500, D] for at most 30 s of 16 kHz audio (padded as Whisper expects)."""
        features = self.features(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        placement, before = self.encoder_placement, torch.get_num_threads()
        if placement is None:
            return self.model.model.encoder(features).last_hidden_state.to(self.dtype)
        torch.set_num_threads(placement.threads)
        try:
            encoded = self.model.model.encoder(features.to(placement.torch_dtype)).last_hidden_state
        finally:
            torch.set_num_threads(before)
        return encoded.to(self.dtype)

    def prefill(self, request: DecodeRequest, encoded: torch.Tensor | None = None) -> DecoderState:
        if encoded is None:
            if request.audio is None:
                raise ValueError("a Whisper request needs audio")
            encoded = self.encode_audio(request.audio)
        state = self._new_state(len(request.prompt_ids), encoded)
        state.extras["encoded"] = encoded
        self.prefill_tokens(state, request.prompt_ids, len(request.prompt_ids))
        return state

    def probe_context(self) -> torch.Tensor:
        """A fixed pseudo-random encoder output [1, T, D] for the self-test (models/selftest.py)."""
        config = self.model.config
        generator = torch.Generator().manual_seed(99)
        return torch.randn(1, config.max_source_positions, config.d_model, generator=generator).to(self.dtype)

    def _default_shape(self) -> CallShape:
        # the prompt is 2-4 tokens: it fits one decoding block
        return CallShape(width=DEFAULT_WIDTH, prefill_width=DEFAULT_WIDTH, capacity=self.max_length)

    def _block_forward(self) -> WhisperBlockForward:
        return WhisperBlockForward(self.model)

    def _dynamic_cache(self) -> EncoderDecoderCache:
        return EncoderDecoderCache(DynamicCache(config=self._cache_config), DynamicCache(config=self._cache_config))

    def _hidden(self, state: DecoderState, ids: torch.Tensor) -> torch.Tensor:
        decoder = self.model.model.decoder
        encoded = state.extras["encoded"]
        return decoder(
            input_ids=ids, encoder_hidden_states=encoded, cache=state.cache, use_cache=True
        ).last_hidden_state

    def _output_weight(self) -> torch.Tensor:
        return self.model.proj_out.weight

    def _self_attention_cache(self, state: DecoderState):
        return state.cache.self_attention_cache

    def _suppressed(self, state: DecoderState, n: int) -> torch.Tensor:
        """Row i predicts position state.length + i + 1; the first output position also gets the
        begin-suppression (no blank, no immediate end), as Whisper's reference decoder does."""
        rows = self._suppress.expand(n, -1).clone()
        first_output_row = state.prompt_len - state.length - 1
        if 0 <= first_output_row < n:
            rows[first_output_row] = self._suppress_begin
        return rows


def _token_list(model: WhisperForConditionalGeneration, key: str) -> list[int]:
    value = getattr(model.generation_config, key, None) or getattr(model.config, key, None)
    return [int(t) for t in (value or [])]


def _mask(vocab: int, ids: list[int]) -> torch.Tensor:
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[[i for i in ids if 0 <= i < vocab]] = True
    return mask
