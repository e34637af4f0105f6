"""Whisper's decision rules for a window decoded with timestamps, as one function of a row's logits
and the output tokens before it (openai-whisper's ApplyTimestampRules, faster-whisper's through
CTranslate2).

They are part of the target's decision rule: the backend applies them in `extend`, so target-only
and every speculative method see the same masked logits for the same prefix. Each row is masked by
its own prefix only (the candidates before it in the call), never by the call it is in, so the
fixed-shape engine's guarantee (a row's logits never depend on its call) carries over.

- `<|notimestamps|>` never appears in the output;
- the first output token is a timestamp no later than `max_initial_timestamp` (1 s);
- timestamps come in pairs: after a lone timestamp (a segment's end) only a timestamp or the end
  of text may follow; after a pair (a segment's start) only text;
- timestamps never decrease, and a segment has a nonzero length;
- when the timestamps' total probability beats every single text token, text is suppressed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

TIME_PRECISION_S = 0.02  # seconds per timestamp token (Whisper's 1500 encoder frames over 30 s)
MAX_INITIAL_TIMESTAMP_S = 1.0


@dataclass(frozen=True)
class TimestampRules:
    timestamp_begin: int  # id of <|0.00|>; every id from it on is a timestamp
    eot: int  # <|endoftext|>
    no_timestamps: int  # <|notimestamps|>
    max_initial_index: int = round(MAX_INITIAL_TIMESTAMP_S / TIME_PRECISION_S)

    def is_timestamp(self, token: int) -> bool:
        return token >= self.timestamp_begin

    def seconds(self, token: int) -> float:
        return (token - self.timestamp_begin) * TIME_PRECISION_S

    def token_at(self, seconds: float) -> int:
        return self.timestamp_begin + max(0, round(seconds / TIME_PRECISION_S))


def apply_timestamp_rules(
    rules: TimestampRules,
    logits: torch.Tensor,  # float32 [n, V], masked in place
    outputs: Sequence[Sequence[int]],  # per row: the output tokens (after the prompt) it follows
) -> None:
    begin = rules.timestamp_begin
    for row, sampled in enumerate(outputs):
        logits[row, rules.no_timestamps] = float("-inf")
        _pairing_and_order(rules, logits[row], sampled)
        if not sampled:  # the first output token: a timestamp, within the initial bound
            logits[row, :begin] = float("-inf")
            logits[row, begin + rules.max_initial_index + 1 :] = float("-inf")
    _timestamps_over_text(begin, logits)


def _pairing_and_order(rules: TimestampRules, row: torch.Tensor, sampled: Sequence[int]) -> None:
    begin = rules.timestamp_begin
    last_was_timestamp = len(sampled) >= 1 and sampled[-1] >= begin
    penultimate_was_timestamp = len(sampled) < 2 or sampled[-2] >= begin
    if last_was_timestamp:
        if penultimate_was_timestamp:  # a segment has just started: text must follow
            row[begin:] = float("-inf")
        else:  # a segment has just ended: the next segment's start, or the end of text
            row[: rules.eot] = float("-inf")
    timestamps = [t for t in sampled if t >= begin]
    if timestamps:
        # never backwards; a closing timestamp may repeat as the next opening, nothing else may
        last = timestamps[-1] if last_was_timestamp and not penultimate_was_timestamp else timestamps[-1] + 1
        row[begin:last] = float("-inf")


def _timestamps_over_text(begin: int, logits: torch.Tensor) -> None:
    """Where the timestamps' summed probability beats the likeliest text token, only a timestamp
    may follow. Both sides are log-probabilities, shifted by the row's log-partition, which cancels:
    so the rule compares the timestamps' log-sum-exp of the logits with the text's largest logit,
    without a softmax over the vocabulary (a row's log_softmax was most of this rule's 1.2 ms per
    8-row call). The max is exact in any order, one reduction for all rows; the log-sum-exp is a
    vectorised sum, taken row by row on a fresh contiguous copy: its result can depend on the
    row's memory alignment, which here would depend on the row's place in the call."""
    best_text = logits[:, :begin].amax(dim=-1)
    for row in range(logits.shape[0]):
        if torch.logsumexp(logits[row, begin:].clone(), dim=-1) > best_text[row]:
            logits[row, :begin] = float("-inf")
