"""What the invariance self-test and its batch check compare: a fixed probe sequence, and rows and
keys/values bit for bit."""

from __future__ import annotations

import torch

from asyncspec.models.base import DecoderState
from asyncspec.models.fixed_shape import StaticKV


def probe_tokens(backend, n: int) -> list[int]:
    """A fixed pseudo-random token sequence inside the vocabulary."""
    generator = torch.Generator().manual_seed(1234)
    return torch.randint(0, backend.vocab_size, (n,), generator=generator).tolist()


def kv_rows(state: DecoderState) -> list[torch.Tensor]:
    """Every layer's keys and values of the positions the state holds."""
    cache, length = state.cache, state.length
    if isinstance(cache, StaticKV):
        return [t[:, :length] for t in (*cache.keys, *cache.values)]
    if not hasattr(getattr(cache, "self_attention_cache", cache), "layers"):
        return []  # a decoder without a KV cache: its logits are what is compared
    layers = getattr(cache, "self_attention_cache", cache).layers
    return [t[0, :, :length] for layer in layers for t in (layer.keys, layer.values)]


def compare_rows(reference, reference_kv, logits, state, n: int) -> tuple[list[int], list[int]]:
    """(rows of `logits` not bitwise `reference`'s, indices of the state's key/value tensors not bitwise
    `reference_kv`'s)."""
    differing = [i for i in range(n) if not torch.equal(logits[i], reference[i])]
    kv = [i for i, (a, b) in enumerate(zip(kv_rows(state), reference_kv, strict=True)) if not torch.equal(a, b)]
    return differing, kv
