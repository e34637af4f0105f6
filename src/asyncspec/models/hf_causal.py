"""Causal LM backend on transformers weights (Qwen2.5-Coder; any AutoModelForCausalLM on the
transformers engine, Llama-layout models on the fixed-shape engine)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from asyncspec.errors import InputError
from asyncspec.models.base import DecodeRequest, DecoderState
from asyncspec.models.fixed_shape import CallShape
from asyncspec.models.forward_causal import CausalBlockForward
from asyncspec.models.int8_weights import weights_identity
from asyncspec.models.kv_backend import DEFAULT_WIDTH, FIXED_SHAPE, KVBackend
from asyncspec.models.tokenizer import TextTokenizer

DEFAULT_MAX_LENGTH = 4096
PREFILL_WIDTH = 64  # rows of every prompt block: a long prompt is not prefilled 8 rows at a time


class CausalLMBackend(KVBackend):
    def __init__(
        self,
        model,
        tokenizer: TextTokenizer,
        name: str,
        eos_ids: frozenset[int],
        engine: str = FIXED_SHAPE,
        shape: CallShape | None = None,
        int8: bool = False,
        weights: dict | None = None,  # the model file's identity: its int8 weights are cached under it
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.eos_ids = eos_ids
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = min(getattr(model.config, "max_position_embeddings", DEFAULT_MAX_LENGTH), DEFAULT_MAX_LENGTH)
        self._init_engine(engine, shape, int8, weights)

    @classmethod
    def load(
        cls, source: str | Path, name: str, dtype: torch.dtype, engine: str = FIXED_SHAPE, int8: bool = False
    ) -> CausalLMBackend:
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype)
        hf_tokenizer = AutoTokenizer.from_pretrained(str(source))
        eos = _eos_ids(model, hf_tokenizer)
        tokenizer = TextTokenizer(hf_tokenizer.backend_tokenizer)
        return cls(model, tokenizer, name, eos, engine=engine, int8=int8, weights=weights_identity(source))

    def request(self, prompt: str, max_new_tokens: int = 256) -> DecodeRequest:
        ids = self.tokenizer.encode(prompt)
        if not ids:
            raise InputError("the prompt is empty")
        return DecodeRequest(prompt_ids=tuple(ids), max_new_tokens=max_new_tokens)

    def prefill(self, request: DecodeRequest) -> DecoderState:
        state = self._new_state(len(request.prompt_ids))
        self.prefill_tokens(state, request.prompt_ids, len(request.prompt_ids))
        return state

    def empty_state(self) -> DecoderState:
        """A state holding nothing yet (the cloud verifier fills it with `prefill_tokens`)."""
        return self._new_state(0)

    def probe_context(self) -> None:
        return None  # a causal LM is conditioned on its tokens only

    def _default_shape(self) -> CallShape:
        return CallShape(width=DEFAULT_WIDTH, prefill_width=PREFILL_WIDTH, capacity=self.max_length)

    def _block_forward(self, shape: CallShape) -> CausalBlockForward:
        return CausalBlockForward(self.model)  # no cross-attention: every product is per row or a linear

    def _dynamic_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def _hidden(self, state: DecoderState, ids: torch.Tensor) -> torch.Tensor:
        return self.model.model(input_ids=ids, cache=state.cache, use_cache=True).last_hidden_state

    def _output_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def _decoder_layers(self) -> torch.nn.Module:
        return self.model.model.layers


def _eos_ids(model, hf_tokenizer) -> frozenset[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if hf_tokenizer.eos_token_id is not None:
        ids.append(hf_tokenizer.eos_token_id)
    # A raw (non-chat) prompt ends with end-of-text even in instruct models.
    end_of_text = hf_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(end_of_text, int) and end_of_text != hf_tokenizer.unk_token_id:
        ids.append(end_of_text)
    return frozenset(ids)
