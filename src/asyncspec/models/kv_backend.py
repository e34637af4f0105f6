"""What the model backends share: KV bookkeeping, rollback, the greedy rule, and the choice of
engine that runs the decoder.

Two engines run the same weights:
- `fixed-shape` (the default, and the only one a target may use): every call has one shape, so
  a row's logits never depend on the call that computed them (models/fixed_shape.py);
- `transformers`: the model's own forward with a growing DynamicCache. Its rows depend on the
  call's width; cheap one-token steps make it the drafters' engine.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from asyncspec.models.base import DecoderState
from asyncspec.models.fixed_shape import CallShape, FixedShapeEngine, RowSlot, StaticKV
from asyncspec.models.int8_linear import Int8Linear, linear_weights, quantize_linears, weight_range
from asyncspec.models.int8_weights import quantized_weights
from asyncspec.models.tokenizer import TextTokenizer

FIXED_SHAPE = "fixed-shape"
TRANSFORMERS = "transformers"
ENGINES = (FIXED_SHAPE, TRANSFORMERS)
OUTPUT_NAME = "<output>"  # the output projection among the quantized weights: no linear's name
DEFAULT_WIDTH = 8  # rows of every target call: root + up to 7 candidates
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}


class KVBackend:
    """Subclasses provide `_block_forward()`, `_default_shape()`, and for the transformers engine
    `_dynamic_cache()`, `_hidden(state, ids)`; plus `_output_weight()` and `_suppressed(state, n)`."""

    name: str
    tokenizer: TextTokenizer
    eos_ids: frozenset[int]
    vocab_size: int
    max_length: int
    dtype: torch.dtype
    engine: FixedShapeEngine | None = None  # None: the transformers engine
    invariance = None  # selftest.InvarianceReport once checked (models/selftest.py)
    # int8 weights (models/int8_linear.py): the decoder's linears and the output projection
    output_int8: Int8Linear | None = None
    precision_choice: Any = None  # precision_choice.PrecisionChoice when loaded with dtype "auto"

    # The model family's parts (hf_causal.py, hf_whisper.py), declared here so the shared code is checked.
    def _default_shape(self) -> CallShape:
        raise NotImplementedError

    def _block_forward(self, shape: CallShape) -> Any:  # the family's block forward for the fixed-shape engine
        raise NotImplementedError

    def _dynamic_cache(self) -> Any:  # a transformers cache of the family's kind
        raise NotImplementedError

    def _hidden(self, state: DecoderState, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _output_weight(self) -> torch.Tensor:
        raise NotImplementedError

    def _decoder_layers(self) -> torch.nn.Module:  # the module whose linears int8 replaces
        raise NotImplementedError

    def _init_engine(
        self, engine: str, shape: CallShape | None, int8: bool = False, weights: dict | None = None
    ) -> None:
        """weights: the model file's identity (int8_weights.weights_identity), under which its
        int8 weights are kept in the per-machine cache; None: quantized at every start."""
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        if int8:
            if self.dtype != torch.float32:
                raise ValueError("int8 weights are quantized from an fp32 model (norms and attention stay fp32)")
            layers = self._decoder_layers()
            named = linear_weights(layers) | {OUTPUT_NAME: self._output_weight()}
            quantized = quantized_weights(named, weight_range(), weights)
            quantize_linears(layers, quantized)
            self.output_int8 = Int8Linear(self._output_weight(), None, kept=quantized[OUTPUT_NAME])
        if engine == FIXED_SHAPE:
            shape = shape or self._default_shape()
            self.max_length = min(self.max_length, shape.capacity)
            self.engine = FixedShapeEngine(self._block_forward(shape), self.project, shape)

    @functools.cached_property
    def project(self):
        """Final hidden states [..., D] -> logits [..., V]: the int8 or the float output linear
        (built after _init_engine has quantized, and kept)."""
        if self.output_int8 is not None:
            return self.output_int8
        return functools.partial(torch.nn.functional.linear, weight=self._output_weight())

    def describe(self) -> str:
        """One line for a user: the model, its precision and why, the encoder's placement."""
        parts = [f"{self.name} {self.precision}"]
        if self.precision_choice is not None:
            parts.append(self.precision_choice.summary())
        placement = getattr(self, "encoder_placement", None)
        if placement is not None:
            parts.append(placement.summary())
        return "; ".join(parts)

    @property
    def precision(self) -> str:
        """What the decoder's weights compute in: "int8", or the float dtype's name."""
        return "int8" if self.output_int8 is not None else DTYPE_NAMES.get(self.dtype, str(self.dtype))

    @property
    def engine_name(self) -> str:
        return TRANSFORMERS if self.engine is None else FIXED_SHAPE

    @property
    def call_width(self) -> int | None:
        """Rows of every call under the fixed-shape engine; None when calls take any width."""
        return None if self.engine is None else self.engine.shape.width

    def _new_state(self, prompt_len: int, context: torch.Tensor | None = None) -> DecoderState:
        cache = self._dynamic_cache() if self.engine is None else self.engine.new_cache(context)
        return DecoderState(tokens=[], prompt_len=prompt_len, cache=cache, next_logits=None)

    @torch.inference_mode()
    def extend(self, state: DecoderState, tokens: Sequence[int]) -> torch.Tensor:
        return self._append(state, tokens)

    @torch.inference_mode()
    def prefill_tokens(
        self, state: DecoderState, tokens: Sequence[int], prompt_len: int, wanted: Sequence[int] = ()
    ) -> torch.Tensor:
        """Fill an empty state with a prompt (and any output after it); the float32 logits
        [len(wanted), V] of the rows `wanted` (indices into tokens), no other prompt row projected.
        A row inside the prompt's head is raw; the last prompt token's row is a decoding row, with
        the decision rules applied. In the blocks every run of the request uses: the prompt but its
        last token in prefill blocks, the rest as decoding calls. The last prompt token is a
        decoding call because the cloud verifier receives it as the root of the request's first
        block."""
        if state.length:
            raise ValueError("prefill_tokens needs an empty state")
        head = [int(t) for t in tokens[: max(prompt_len - 1, 0)]]
        tail = list(tokens[len(head) :])
        state.prompt_len = prompt_len
        in_head = [index for index in wanted if index < len(head)]
        head_rows = self._prefill_head(state, head, in_head) if head else torch.empty(0, self.vocab_size)
        tail_rows = self._append(state, tail) if tail else torch.empty(0, self.vocab_size)
        # a wanted row past the head (a prompt of one token) is the first decoding row, masked as such
        picked = {index: row for index, row in zip(in_head, head_rows, strict=True)}
        if not wanted:
            return head_rows
        return torch.stack([picked[i] if i in picked else tail_rows[i - len(head)] for i in wanted])

    def _prefill_head(self, state: DecoderState, head: list[int], wanted: Sequence[int]) -> torch.Tensor:
        self._check_tokens(state, head)
        if self.engine is not None:
            raw = self.engine.prefill(state.cache, state.length, head, wanted)
        else:
            raw = self.project(self._hidden(state, torch.tensor([head]))[0])[list(wanted)]
        state.tokens.extend(head)
        return raw.float()

    def _check_tokens(self, state: DecoderState, tokens: list[int]) -> None:
        if not tokens:
            raise ValueError("extend needs at least one token")
        if state.length + len(tokens) > self.max_length:
            raise ValueError(
                f"{self.name}: {state.length + len(tokens)} positions exceed the model's {self.max_length}"
            )
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{self.name}: token ids {bad[:5]} are outside the vocabulary")

    def _append(self, state: DecoderState, tokens: Sequence[int]) -> torch.Tensor:
        tokens = [int(t) for t in tokens]
        self._check_tokens(state, tokens)
        if self.engine is not None:
            raw = self.engine.run(state.cache, state.length, tokens)
        else:
            raw = self.project(self._hidden(state, torch.tensor([tokens]))[0])
        logits = raw.float()
        self._settle(state, tokens, logits)
        return logits

    def _settle(self, state: DecoderState, tokens: list[int], logits: torch.Tensor) -> None:
        """The state after its new tokens: their logits masked by the decision rules, in place."""
        self._apply_rules(state, tokens, logits)
        state.tokens.extend(tokens)
        state.next_logits = logits[-1]

    def extend_each(self, states: Sequence[DecoderState], tokens: Sequence[int]) -> list[torch.Tensor]:
        """Append tokens[i] to states[i], the requests' rows side by side in calls of the engine's
        width; the float32 logits [V] after each, bitwise what `extend(states[i], [tokens[i]])`
        returns (models/fixed_shape.py: a row never sees the call it is in)."""
        return [rows[-1] for rows in self.extend_packed(states, [[token] for token in tokens])]

    @torch.inference_mode()
    def extend_packed(
        self, states: Sequence[DecoderState], token_lists: Sequence[Sequence[int]], most_blocks: int = 1
    ) -> list[torch.Tensor]:
        """`extend(states[i], token_lists[i])` for every i, all the requests' rows packed together into
        calls of the engine's width (FixedShapeEngine.run_rows), bitwise what `extend` returns: a
        request's rows may sit anywhere in a call and share it with any other request's. With
        `most_blocks` > 1, calls of up to that many blocks: only where the invariance self-test's
        batch check proved packed stacks of that many blocks equal (InvarianceReport.stacking)."""
        lists = self._checked_requests("extend_packed", states, token_lists)
        slots = [
            RowSlot(state.cache, state.length + offset)
            for state, tokens in zip(states, lists, strict=True)
            for offset in range(len(tokens))
        ]
        logits = self.engine.run_rows(slots, [token for tokens in lists for token in tokens], most_blocks).float()
        out, done = [], 0
        for state, tokens in zip(states, lists, strict=True):
            rows = logits[done : done + len(tokens)].clone()  # its own memory: the rules mask it in place
            self._settle(state, tokens, rows)
            out.append(rows)
            done += len(tokens)
        return out

    @torch.inference_mode()
    def extend_stacked(
        self, states: Sequence[DecoderState], token_lists: Sequence[Sequence[int]], most_blocks: int
    ) -> list[torch.Tensor]:
        """`extend(states[i], token_lists[i])` for every i, the requests' blocks stacked into calls
        of up to `most_blocks` blocks (FixedShapeEngine.run_stacked). Bitwise what `extend` returns
        only where the invariance self-test's batch check passed for this target at that many
        blocks (selftest.InvarianceReport.stacking): the caller asks it first."""
        lists = self._checked_requests("extend_stacked", states, token_lists)
        parts = [(state.cache, state.length, tokens) for state, tokens in zip(states, lists, strict=True)]
        out = []
        for state, tokens, raw in zip(states, lists, self.engine.run_stacked(parts, most_blocks), strict=True):
            logits = raw.float()
            self._settle(state, tokens, logits)
            out.append(logits)
        return out

    def _checked_requests(
        self, what: str, states: Sequence[DecoderState], token_lists: Sequence[Sequence[int]]
    ) -> list[list[int]]:
        """The token lists as ints, once each request is known distinct and its tokens fit it; the
        calls that put several requests side by side need the fixed-shape engine."""
        if self.engine is None:
            raise TypeError(f"{what} needs the fixed-shape engine")
        if len({id(state.cache) for state in states}) != len(states):
            raise ValueError(f"{what} takes each request once")
        lists = [[int(t) for t in tokens] for tokens in token_lists]
        for state, tokens in zip(states, lists, strict=True):
            self._check_tokens(state, tokens)
        return lists

    def rollback(self, state: DecoderState, length: int) -> None:
        if not 0 < length <= state.length:
            raise ValueError(f"rollback to {length} outside 1..{state.length}")
        removed = state.length - length
        if removed:
            if self.engine is None:
                self._self_attention_cache(state).crop(-removed)
            del state.tokens[length:]  # fixed-shape: the slots past the length are rewritten before use
            state.next_logits = None

    def copy_state(self, state: DecoderState) -> DecoderState:
        """An independent copy of a request's state (cross-attention K/V shared, read-only)."""
        if not isinstance(state.cache, StaticKV):
            raise TypeError("copy_state needs the fixed-shape engine")
        logits = None if state.next_logits is None else state.next_logits.clone()
        copy = DecoderState(list(state.tokens), state.prompt_len, state.cache.copy(), logits, dict(state.extras))
        sink = state.extras.get("attention_sink")  # word timestamps: a fallback's draws are kept too
        if sink is not None:
            sink.states.append(copy)
        return copy

    @torch.inference_mode()
    def copy_state_into(self, source: DecoderState, destination: DecoderState) -> None:
        """Make `destination`, a state of the same request that is no longer needed, an independent
        copy of `source` in its own memory, so a beam search's step allocates nothing. Only the rows
        past the two states' common tokens are copied: a position's keys and values are a function
        of the tokens up to it (models/fixed_shape.py), so the shared prompt and prefix already hold
        the same bits; the slots past a state's length are rewritten before use."""
        held, kept = source.cache, destination.cache
        if not isinstance(held, StaticKV) or not isinstance(kept, StaticKV) or held.cross is not kept.cross:
            raise TypeError("copy_state_into needs two fixed-shape states of one request")
        n, start = source.length, _common_length(source.tokens, destination.tokens)
        if start < n:
            for mine, theirs in zip([*kept.keys, *kept.values], [*held.keys, *held.values], strict=True):
                mine[:, start:n].copy_(theirs[:, start:n])
            if held.attention is not None and kept.attention is not None:
                kept.attention.weights[start:n].copy_(held.attention.weights[start:n])
        destination.tokens[:] = source.tokens
        destination.prompt_len = source.prompt_len
        destination.next_logits = None if source.next_logits is None else source.next_logits.clone()
        destination.extras = dict(source.extras)

    def greedy(self, logits: torch.Tensor) -> list[int]:
        """argmax per row of float32 logits [..., V]; the first index wins an exact tie."""
        return logits.argmax(dim=-1).reshape(-1).tolist()

    def cache_length(self, state: DecoderState) -> int:
        """Positions the KV cache holds for the request (tests check it equals state.length)."""
        if self.engine is not None:
            return state.length
        return self._self_attention_cache(state).get_seq_length()

    def _self_attention_cache(self, state: DecoderState):
        return state.cache

    def _apply_rules(self, state: DecoderState, tokens: list[int], logits: torch.Tensor) -> None:
        """Mask logits [len(tokens), V] in place by the backend's decision rules; row i follows
        state.tokens + tokens[: i + 1] (nothing of the call it is in)."""
        suppressed = self._suppressed(state, len(tokens))
        if suppressed is not None:
            logits.masked_fill_(suppressed, float("-inf"))

    def _suppressed(self, state: DecoderState, n: int) -> torch.Tensor | None:
        return None


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
