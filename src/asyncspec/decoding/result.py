"""What every decoding method returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asyncspec.models.base import Decoder, DecodeRequest, DecoderState
from asyncspec.shaping import NEUTRAL, Shaping
from asyncspec.trace import Trace

if TYPE_CHECKING:
    from asyncspec.decoding.as2d import As2dFigures


@dataclass(frozen=True)
class DecodeConfig:
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0
    budget: int | None = None  # proposals per round for every method (--budget; None: each method's own)
    # per-method budgets used when `budget` is unset, e.g. As²d's deployed configuration's
    method_budgets: tuple[tuple[str, int], ...] = ()
    # sampling keyed by output position (sampling.py): every method draws target-only's sample
    positional_sampling: bool = False
    # OpenAI's penalties and top_p (shaping.py); target-only applies them (the edge's reference)
    shaping: Shaping = NEUTRAL
    # greedy (temperature 0) as a beam search of this many hypotheses (decoding/beam_search.py),
    # with faster-whisper's patience and length penalty
    beam_size: int = 1
    patience: float = 1.0
    length_penalty: float = 1.0

    def budget_for(self, method: str, default: int) -> int:
        """The method's proposals per round: --budget, else its configured one, else its default."""
        return self.budget or dict(self.method_budgets).get(method) or default


@dataclass
class DecodeStats:
    prefill_s: float = 0.0
    decode_s: float = 0.0  # after prefill, until the last token is committed
    target_calls: int = 0  # excluding prefill
    call_widths: list[int] = field(default_factory=list)
    finish_reason: str = ""  # "eos" or "length"
    # speculative rounds (vocabulary of verify.py): drafted candidates, accepted ones, and the
    # target's own token per round: recovered after a rejection or bonus after full acceptance
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    recovered: int = 0
    bonus: int = 0
    position_tried: list[int] = field(default_factory=list)  # rounds that verified position i
    position_accepted: list[int] = field(default_factory=list)  # ... and accepted it
    drafter_calls: int = 0
    recycled: int = 0  # candidates reused from an earlier draft instead of drafted again
    draft_s: float = 0.0  # drafting time on the target's critical path (conversion included)
    convert_s: float = 0.0
    as2d: As2dFigures | None = None  # As²d's own figures (stage accounting, buffer, producer)
    notes: dict = field(default_factory=dict)  # a benchmark's annotations (e.g. bench ondevice's sd sweep)
    # log p of every committed token and of the end of text, under the target's masked logits
    logprobs: list[float] = field(default_factory=list)
    prefill_figures: dict = field(default_factory=dict)  # what the backend measured at prefill (no-speech p)

    @property
    def extra(self) -> dict:
        """The method-specific figures as JSON fields (a record merges them into its own)."""
        return (self.as2d.as_dict() if self.as2d is not None else {}) | self.notes

    def observe_round(self, n_candidates: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += n_candidates
        self.accepted += accepted
        self.recovered += accepted < n_candidates
        self.bonus += accepted == n_candidates
        for i in range(n_candidates):
            if i == len(self.position_tried):
                self.position_tried.append(0)
                self.position_accepted.append(0)
            self.position_tried[i] += 1
            self.position_accepted[i] += i < accepted

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Accepted candidates per verification round."""
        return self.accepted / self.rounds if self.rounds else 0.0

    def tps(self, n_tokens: int) -> float:
        return n_tokens / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class DecodeResult:
    method: str
    tokens: list[int]  # committed target token ids, end-of-sequence excluded
    stats: DecodeStats
    trace: Trace

    @property
    def tps(self) -> float:
        return self.stats.tps(len(self.tokens))


def observe_prefill(stats: DecodeStats, state: DecoderState) -> None:
    stats.prefill_figures = dict(state.extras.get("figures", {}))


def output_limit(request: DecodeRequest, target: Decoder) -> int:
    """Most tokens a method may commit: the request's cap, or what fits the target's positions
    (the last committed token is never fed back, hence the + 1)."""
    return min(request.max_new_tokens, target.max_length - len(request.prompt_ids) + 1)


def commit_token(token: int, committed: list[int], eos_ids: frozenset[int], limit: int, stats: DecodeStats) -> bool:
    """Append a target-approved token; False when decoding ends (end of sequence or length)."""
    if token in eos_ids:
        stats.finish_reason = "eos"
        return False
    committed.append(token)
    if len(committed) >= limit:
        stats.finish_reason = "length"
        return False
    return True
