"""How many of the ready candidates an As²d verification call carries, where the target's calls
may run at several sizes (the int8 engine's narrow calls, proven exact by the self-test).

A call carrying the root and k candidates commits the root's successor and every candidate up to
the first rejected one. The j-th candidate counts only if those before it were accepted: with alpha
the chance that a candidate is accepted after an accepted one, it is worth alpha ** j. A wider call
costs more, but not in proportion (whisper-base int8, two threads, Zen 2: 13.3 ms for 1 row, 15.0
for 2, 19.4 for 4, 25.0 for 8), so the plan carries the candidates that fit the size committing
the most expected tokens per second of target time. Which candidates are carried changes no
committed token: the target decides every one.

alpha is the request's own: accepted candidates against rejections, over its rounds, each round's
evidence decayed by DECAY (a producer that loses its alignment stops being paid for within a few
rounds), with a prior of one of each (1/2 before any round). Evidence decays in rounds that carry
nothing too, so alpha drifts back towards 1/2 and a request that stopped carrying candidates tries
again.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.8


@dataclass
class VerifyPlan:
    seconds: dict[int, float]  # rows -> seconds of one decoding call of that size (every proven size)
    accepted: float = 0.0  # decayed count of accepted candidates
    rejected: float = 0.0  # decayed count of rounds that rejected a carried candidate

    def __post_init__(self) -> None:
        if not self.seconds or min(self.seconds.values()) <= 0 or min(self.seconds) < 1:
            raise ValueError(f"a verify plan needs a positive time for each call size, got {self.seconds}")

    @property
    def alpha(self) -> float:
        return (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)

    def carried(self, ready: int) -> int:
        """How many of the `ready` candidates (in order) the next call carries: never more than
        the widest call holds, for a second call's candidates are worth more in the next round,
        after a root of their own."""
        alpha, best_rate, best = self.alpha, 0.0, 0
        for rows, seconds in sorted(self.seconds.items()):
            taken = min(rows - 1, ready)
            rate = (1.0 + sum(alpha**j for j in range(1, taken + 1))) / seconds
            if rate > best_rate:
                best_rate, best = rate, taken
        return best

    def observe(self, carried: int, accepted: int) -> None:
        """A round's verdict: `accepted` of its `carried` candidates."""
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (1.0 if accepted < carried else 0.0)
