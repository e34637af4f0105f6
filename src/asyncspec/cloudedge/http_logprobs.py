"""Log-probabilities in OpenAI's response shapes: /v1/completions' `logprobs` object (tokens,
token_logprobs, top_logprobs, text_offset) and chat's `logprobs.content` list (token, logprob, bytes,
top_logprobs). JSON has no infinity: a token its law gives no probability (outside top_p's nucleus)
is reported at -9999.0, the value OpenAI uses."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from asyncspec.cloudedge.logprobs import TokenLogprob

NO_PROBABILITY = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else NO_PROBABILITY


def rendered_logprobs(
    kind: str, tokens: Sequence[int], entries: Sequence[TokenLogprob | None], decode: Callable[[list[int]], str]
) -> dict:
    """`kind` "cmpl" or "chatcmpl"; entries[i] belongs to tokens[i] (each token decoded on its own)."""
    if len(entries) != len(tokens) or any(entry is None for entry in entries):
        raise ValueError("a committed token came without its log-probability")
    texts = [decode([token]) for token in tokens]
    if kind == "cmpl":
        offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
        return {
            "tokens": texts,
            "token_logprobs": [_finite(e.logprob) for e in entries if e is not None],
            "top_logprobs": [{decode([t]): _finite(lp) for t, lp in e.top} for e in entries if e is not None],
            "text_offset": offsets,
        }
    return {"content": [_chat_entry(text, e, decode) for text, e in zip(texts, entries, strict=True) if e is not None]}


def _chat_entry(text: str, entry: TokenLogprob, decode) -> dict:
    top = [{"token": decode([t]), "logprob": _finite(lp), "bytes": list(decode([t]).encode())} for t, lp in entry.top]
    return {"token": text, "logprob": _finite(entry.logprob), "bytes": list(text.encode()), "top_logprobs": top}
