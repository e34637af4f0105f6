"""Standard speculative decoding (Leviathan et al.): a prefix-conditioned drafter proposes a
fixed budget of candidates, the target verifies them in one call, the next round starts from
the committed prefix. Drafting and verification are serial."""

from __future__ import annotations

from asyncspec.decoding.drafter import PrefixDrafter, Proposal
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.decoding.speculative import speculative_decode
from asyncspec.errors import InputError
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.sampling import make_generator
from asyncspec.verify import Verdict

METHOD = "sd"
DEFAULT_BUDGET = 7  # proposals per round: physical verification width K <= 8


class FixedBudgetSource:
    def __init__(self, drafter: PrefixDrafter, config: DecodeConfig):
        self.drafter = drafter
        self.counters = drafter.counters
        self.temperature = config.temperature
        self.generator = make_generator(config.seed + 1)  # independent of the target's draws

    def start(self, request: DecodeRequest) -> None:
        self.drafter.start(request)

    def get_candidates(self, committed: list[int], max_tokens: int) -> Proposal:
        return self.drafter.propose(committed, max_tokens, temperature=self.temperature, generator=self.generator)

    def update(self, proposal: Proposal, verdict: Verdict) -> None:
        pass


def require_drafter(drafter: Decoder | None, method: str) -> Decoder:
    if drafter is None:
        raise InputError(f"method {method!r} needs a drafter (--drafter)")
    return drafter


def decode_standard_sd(
    target: Decoder, drafter: Decoder | None, request: DecodeRequest, config: DecodeConfig
) -> DecodeResult:
    source = FixedBudgetSource(PrefixDrafter(require_drafter(drafter, METHOD), target), config)
    return speculative_decode(METHOD, target, source, request, config, config.budget_for(METHOD, DEFAULT_BUDGET))
