"""Equality with target-only, the product's promise: a mismatch is a defect, never a footnote.

Every command that compares a method's output with target-only decoding feeds its comparisons to
one `ExactnessCheck`. A mismatch is diagnosed where it happened: the first divergent output
position, both tokens (ids and text) and the target's logits for both there, obtained by running
the target over the shared prefix (one prefill, one extend), so a near-tie can be told from a
method that proposes nonsense. A run with a mismatch, or in which nothing was checked, fails.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TextIO

import torch

from asyncspec.models.base import Decoder, DecodeRequest

EXIT_MISMATCH = 1


@dataclass(frozen=True)
class TokenAt:
    """One side's token at the divergent position; `ended` when its output stopped there (then
    `id` is the end-of-sequence id the target rates highest, so its logit is still comparable)."""

    id: int | None
    text: str
    logit: float
    ended: bool = False

    def describe(self) -> str:
        shown = f"end of output (eos {self.id})" if self.ended else f"{self.id} {self.text!r}"
        return f"{shown}, target logit {self.logit:.6g}"


@dataclass(frozen=True)
class Mismatch:
    where: str  # the window or request, as the command names it
    method: str
    position: int  # first output token (after the prompt) where the two differ
    target: TokenAt  # target-only's token there
    method_token: TokenAt  # the method's token there

    @property
    def margin(self) -> float:
        """Target logit of its own token minus that of the method's (small: a near-tie)."""
        return self.target.logit - self.method_token.logit

    def describe(self) -> str:
        return (
            f"MISMATCH: {self.method} differs from target-only on {self.where} at output token {self.position}: "
            f"target-only {self.target.describe()}; {self.method} {self.method_token.describe()}; "
            f"margin {self.margin:.6g}"
        )


def first_divergence(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """Index of the first differing token; the shorter length when one is a prefix of the other;
    None when equal."""
    for index, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return index
    return None if len(expected) == len(got) else min(len(expected), len(got))


def logits_after(target: Decoder, request: DecodeRequest, prefix: Sequence[int]) -> torch.Tensor:
    """The target's float32 logits [V] for the output token after `prefix` (output tokens only)."""
    state = target.prefill(request)
    if prefix:
        target.extend(state, list(prefix))
    return state.next_logits


def token_at(target: Decoder, logits: torch.Tensor, tokens: Sequence[int], position: int) -> TokenAt:
    if position < len(tokens):
        token = int(tokens[position])
        if not 0 <= token < logits.numel():  # a method that emits an id outside the vocabulary
            return TokenAt(token, "<outside the vocabulary>", math.nan)
        return TokenAt(token, target.tokenizer.decode([token]), float(logits[token]))
    if not target.eos_ids:
        return TokenAt(None, "", math.nan, ended=True)
    eos = max(target.eos_ids, key=lambda t: float(logits[t]))
    return TokenAt(eos, target.tokenizer.decode([eos]), float(logits[eos]), ended=True)


def diagnose(
    target: Decoder, request: DecodeRequest, expected: Sequence[int], got: Sequence[int], where: str, method: str
) -> Mismatch:
    position = first_divergence(expected, got)
    if position is None:
        raise ValueError(f"{method} on {where} equals target-only: nothing to diagnose")
    logits = logits_after(target, request, expected[:position])
    ours, theirs = token_at(target, logits, expected, position), token_at(target, logits, got, position)
    return Mismatch(where, method, position, ours, theirs)


@dataclass
class _Pending:
    where: str
    method: str
    request: DecodeRequest
    expected: list[int]
    got: list[int]


@dataclass
class ExactnessCheck:
    """Every comparison of one command run against target-only. Diagnosis runs the target again,
    so it waits until `mismatches()` is asked for (after the measurements, never inside them)."""

    target: Decoder | None = None
    checked: int = 0
    unchecked: list[str] = field(default_factory=list)  # runs that should have been checked but could not be
    _pending: list[_Pending] = field(default_factory=list, init=False, repr=False)
    _diagnosed: list[Mismatch] | None = field(default=None, init=False, repr=False)

    def check(
        self, where: str, method: str, request: DecodeRequest, expected: Sequence[int], got: Sequence[int]
    ) -> bool:
        """True when `got` equals target-only's `expected`; otherwise the mismatch is kept."""
        self.checked += 1
        if list(got) == list(expected):
            return True
        self._pending.append(_Pending(where, method, request, list(expected), list(got)))
        self._diagnosed = None
        return False

    def not_checked(self, what: str) -> None:
        """A run that should have been compared but could not be (it timed out, its output is cut)."""
        self.unchecked.append(what)

    def absorb(self, other: ExactnessCheck) -> None:
        """Take over another check's comparisons (a command that collects in several passes)."""
        self.checked += other.checked
        self.unchecked += other.unchecked
        self._pending += other._pending
        self._diagnosed = None

    @property
    def mismatch_count(self) -> int:
        return len(self._pending)

    @property
    def passed(self) -> bool:
        return self.checked > 0 and not self._pending and not self.unchecked

    def mismatches(self) -> list[Mismatch]:
        if self._diagnosed is None:
            self._diagnosed = [self._diagnose(p) for p in self._pending]
        return self._diagnosed

    def _diagnose(self, pending: _Pending) -> Mismatch:
        if self.target is None:
            raise ValueError("diagnosing a mismatch needs the target")
        return diagnose(self.target, pending.request, pending.expected, pending.got, pending.where, pending.method)

    def lines(self) -> list[str]:
        lines = [m.describe() for m in self.mismatches()]
        lines += [f"NOT CHECKED: {what}" for what in self.unchecked]
        if self.checked == 0:
            lines.append("FAILED: nothing was checked against target-only")
        elif self.passed:
            lines.append(f"exactness: all {self.checked} outputs equal to target-only")
        else:
            lines.append(
                f"FAILED: {self.mismatch_count} of {self.checked} outputs differ from target-only"
                + (f", {len(self.unchecked)} could not be checked" if self.unchecked else "")
            )
        return lines

    def report(self, stream: TextIO | None = None) -> int:
        """Print the verdict (mismatches first); the command's exit code: 0 passed, 1 failed."""
        for line in self.lines():
            print(line, file=stream or sys.stderr)
        return 0 if self.passed else EXIT_MISMATCH

    def as_json(self) -> dict:
        return {
            "passed": self.passed,
            "checked": self.checked,
            "mismatches": [asdict(m) | {"margin": m.margin} for m in self.mismatches()],
            "unchecked": list(self.unchecked),
        }
