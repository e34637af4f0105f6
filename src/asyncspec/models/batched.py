"""One forward pass that extends several requests' KV states at once (the cloud's verify batch).

Each request keeps its own DynamicCache of shape [1, H, L_i, D]. For a batch the caches are
left-padded to a common length L and the new tokens right-padded to a common width N; a 2-D
attention mask hides the padding and explicit position ids keep every request's rotary
positions at L_i, L_i + 1, ... — so each request sees exactly what a one-request call would.
Afterwards the new KV is split back per request (padding dropped) and the logits returned per
request, projected with the backend's own rule (fp32 near-tie re-scoring included).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from asyncspec.models.base import DecoderState
from asyncspec.models.hf_causal import CausalLMBackend


def _layers(state: DecoderState) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) [1, H, L, D] per layer; empty list for a cache that holds nothing yet."""
    cache = state.cache
    if cache.get_seq_length() == 0:
        return []
    return [(layer.keys, layer.values) for layer in cache.layers]


def _padded_cache(backend: CausalLMBackend, states: Sequence[DecoderState], length: int) -> DynamicCache:
    """A batch cache [B, H, length, D] with each request's keys right-aligned (left padding)."""
    config = backend.model.config
    heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    if length == 0:
        return cache
    per_state = [_layers(s) for s in states]
    for layer in range(config.num_hidden_layers):
        keys = torch.zeros(len(states), heads, length, head_dim, dtype=backend.dtype)
        values = torch.zeros_like(keys)
        for row, layers in enumerate(per_state):
            if layers:
                k, v = layers[layer]
                keys[row, :, length - k.shape[-2] :] = k[0]
                values[row, :, length - v.shape[-2] :] = v[0]
        cache.update(keys, values, layer)
    return cache


def _split_back(config, cache: DynamicCache, state: DecoderState, row: int, start: int, stop: int) -> None:
    """Replace the request's cache by its own positions [start, stop) of the batch cache."""
    own = DynamicCache(config=config)
    for index, layer in enumerate(cache.layers):
        keys = layer.keys[row : row + 1, :, start:stop].clone()
        own.update(keys, layer.values[row : row + 1, :, start:stop].clone(), index)
    state.cache = own


@torch.inference_mode()
def extend_batch(
    backend: CausalLMBackend,
    states: Sequence[DecoderState],
    token_lists: Sequence[Sequence[int]],  # one non-empty list of new tokens per state
) -> list[torch.Tensor]:  # float32 [len(tokens_i), V] per state
    """Like `backend.extend(state_i, tokens_i)` for every i, in one forward pass."""
    if len(states) != len(token_lists) or not states:
        raise ValueError("extend_batch needs one non-empty token list per state")
    if len(states) == 1 or backend.engine is not None:
        # Fixed-shape engine: one call per request, so that a request's rows never depend on which
        # requests share the batch (a batched call of another shape would change them).
        return [backend.extend(state, tokens) for state, tokens in zip(states, token_lists, strict=True)]
    lengths = [s.length for s in states]
    widths = [len(t) for t in token_lists]
    if min(widths) == 0:
        raise ValueError("extend_batch needs at least one token per state")
    for length, width in zip(lengths, widths, strict=True):
        if length + width > backend.max_length:
            raise ValueError(f"{backend.name}: {length + width} positions exceed the model's {backend.max_length}")
    longest, widest = max(lengths), max(widths)
    batch = len(states)
    ids = torch.zeros(batch, widest, dtype=torch.long)
    mask = torch.zeros(batch, longest + widest, dtype=torch.long)
    positions = torch.zeros(batch, widest, dtype=torch.long)
    for row, (length, tokens) in enumerate(zip(lengths, token_lists, strict=True)):
        bad = [t for t in tokens if not 0 <= int(t) < backend.vocab_size]
        if bad:
            raise ValueError(f"{backend.name}: token ids {bad[:5]} are outside the vocabulary")
        ids[row, : len(tokens)] = torch.tensor([int(t) for t in tokens])
        mask[row, longest - length : longest + len(tokens)] = 1
        positions[row] = length + torch.arange(widest)
    cache = _padded_cache(backend, states, longest)
    hidden = backend.model.model(
        input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
    ).last_hidden_state  # [B, N, D]
    weight = backend._output_weight()
    results = []
    for row, (state, tokens) in enumerate(zip(states, token_lists, strict=True)):
        logits = torch.nn.functional.linear(hidden[row, : len(tokens)], weight).float()
        _split_back(backend.model.config, cache, state, row, longest - lengths[row], longest + len(tokens))
        state.tokens.extend(int(t) for t in tokens)
        state.next_logits = logits[-1]
        results.append(logits)
    return results
