"""A prefix-conditioned drafter that proposes candidates in the target's vocabulary.

Same vocabulary: the drafter's tokens are the target's. Different vocabulary (Whisper tiny.en
drafting for multilingual Whisper base): the committed target prefix is turned into text and
re-encoded with the drafter's tokenizer, and the drafter's new text is encoded with the target's.
Either way the drafter keeps its KV for the longest common prefix between rounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from asyncspec.errors import InputError
from asyncspec.models.base import Decoder, DecodeRequest, DecoderState
from asyncspec.shaping import NEUTRAL, Shaping, nucleus, penalised
from asyncspec.verify import common_prefix, probabilities


@dataclass
class Proposal:
    tokens: list[int]  # candidates in the target's vocabulary
    confidences: list[float]  # drafter probability of each drafted token (drafter's own tokens)
    q: torch.Tensor | None = None  # [n, V] sampling distributions (same vocabulary, temperature > 0)
    drafted: int = 0  # drafter tokens produced


@dataclass
class DrafterCounters:
    calls: int = 0  # drafter forward calls after its prefill
    convert_s: float = 0.0  # time spent converting between vocabularies
    recycled: int = 0  # candidates reused from an earlier draft (SpecASR recycling)


def same_vocabulary(drafter: Decoder, target: Decoder) -> bool:
    probes = (" the", " And Mr. John", "def f(x):\n    return x")
    return drafter.vocab_size == target.vocab_size and all(
        drafter.tokenizer.encode(text) == target.tokenizer.encode(text) for text in probes
    )


def drafter_request(drafter: Decoder, target_request: DecodeRequest, target: Decoder, converts: bool) -> DecodeRequest:
    """The drafter's own prompt for the same input: its Whisper prompt for the audio, or the text prompt."""
    if target_request.audio is not None:
        if not hasattr(drafter, "prompt_ids"):
            raise InputError(f"drafter {drafter.name} cannot read audio")
        return DecodeRequest(drafter.prompt_ids(), target_request.audio, target_request.max_new_tokens)
    if hasattr(drafter, "prompt_ids"):
        raise InputError(f"drafter {drafter.name} is a speech model; the target needs a text drafter")
    text = target.tokenizer.decode(target_request.prompt_ids)
    ids = tuple(drafter.tokenizer.encode(text)) if converts else target_request.prompt_ids
    return DecodeRequest(ids, None, target_request.max_new_tokens)


class PrefixDrafter:
    """Drafts from the committed target prefix; `propose` may be given unverified tokens to extend."""

    def __init__(self, drafter: Decoder, target: Decoder):
        self.drafter = drafter
        self.target = target
        self.converts = not same_vocabulary(drafter, target)
        self.target_eos = min(target.eos_ids, default=None)
        self.counters = DrafterCounters()
        self.state: DecoderState | None = None  # set by start()
        self.prompt_len = 0

    def start(self, target_request: DecodeRequest) -> None:
        self.state = self.drafter.prefill(drafter_request(self.drafter, target_request, self.target, self.converts))
        self.prompt_len = self.state.length

    def propose(
        self,
        prefix: list[int],  # target tokens after the prompt (committed, plus any unverified reuse)
        max_tokens: int,
        min_confidence: float | None = None,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        keep_q: bool = False,  # also return the rows when greedy (a baseline uploads them)
        shaping: Shaping = NEUTRAL,  # the request's penalties and top_p, applied as the target applies them
    ) -> Proposal:
        """Up to max_tokens candidates; stops after the first token below min_confidence
        (that token included) or at the drafter's end of sequence (proposed as the target's)."""
        if self.converts and temperature > 0:
            raise InputError("sampling needs a drafter with the target's vocabulary")
        wanted = self._to_drafter(prefix)
        if max_tokens <= 0 or self.prompt_len + len(wanted) + 1 > self.drafter.max_length:
            return Proposal([], [])
        self._sync(wanted)
        tokens: list[int] = []
        confidences: list[float] = []
        rows: list[torch.Tensor] = []
        logits = self.state.next_logits
        while True:
            if shaping.penalises:  # the history is a copy per drafted token: only built when it is read
                logits = penalised(logits[None], [wanted + tokens], shaping)[0]
            probs = self._law(logits, temperature, shaping)
            token = self._choose(logits, probs, temperature, generator)
            tokens.append(token)
            confidences.append(float(probs[token]))
            rows.append(probs)
            if self._stop(token, confidences[-1], len(tokens), max_tokens, min_confidence):
                break
            logits = self.drafter.extend(self.state, [token])[-1]
            self.counters.calls += 1
        return self._to_target(wanted, tokens, confidences, rows if temperature > 0 or keep_q else None, max_tokens)

    @staticmethod
    def _law(logits: torch.Tensor, temperature: float, shaping: Shaping) -> torch.Tensor:
        """The distribution a candidate is drawn from (q), or when greedy the confidence's softmax."""
        if temperature <= 0:
            return probabilities(logits, 1.0)
        return nucleus(probabilities(logits, temperature), shaping.top_p)

    def _choose(self, logits, probs, temperature, generator) -> int:
        if temperature <= 0:
            return self.drafter.greedy(logits)[0]
        return int(torch.multinomial(probs, 1, generator=generator).item())

    def _stop(self, token: int, confidence: float, n: int, max_tokens: int, min_confidence: float | None) -> bool:
        return (
            token in self.drafter.eos_ids
            or n >= max_tokens
            or (min_confidence is not None and confidence < min_confidence)
            or self.state.length + 1 >= self.drafter.max_length
        )

    def _sync(self, wanted: list[int]) -> None:
        """Drafter state := prompt + wanted with fresh next logits, keeping the common KV prefix."""
        full = self.state.tokens[: self.prompt_len] + wanted
        have = self.state.tokens
        keep = common_prefix(have, full)
        if keep == len(full) == len(have) and self.state.next_logits is not None:
            return
        keep = min(keep, len(full) - 1)  # at least one token is re-fed, to get its logits
        if keep < self.state.length:
            self.drafter.rollback(self.state, keep)
        self.drafter.extend(self.state, full[keep:])
        self.counters.calls += 1

    @contextmanager
    def _converting(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.counters.convert_s += time.perf_counter() - start

    def _to_drafter(self, prefix: list[int]) -> list[int]:
        if not self.converts:
            return list(prefix)
        with self._converting():
            return self.drafter.tokenizer.encode(self.target.tokenizer.decode(prefix))

    def _to_target(self, wanted, tokens, confidences, rows, max_tokens) -> Proposal:
        ends = bool(tokens) and tokens[-1] in self.drafter.eos_ids
        body = tokens[:-1] if ends else tokens
        if not self.converts:
            q = torch.stack(rows) if rows is not None else None
            end = [tokens[-1] if tokens[-1] in self.target.eos_ids or self.target_eos is None else self.target_eos]
            end = end if ends else []
            return Proposal(body + end, confidences, q, len(tokens))
        with self._converting():
            before = self.drafter.tokenizer.decode(wanted)
            text = self.drafter.tokenizer.decode(wanted + body)
            converted = self.target.tokenizer.encode(text[len(before) :]) if text.startswith(before) else []
        converted = (converted + ([self.target_eos] if ends and self.target_eos is not None else []))[:max_tokens]
        return Proposal(converted, confidences, None, len(tokens))
