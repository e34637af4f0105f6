"""OpenAI's `stop`, `top_p`, `presence_penalty`, `frequency_penalty` and `user` at the edge.

- The shaped sampling law through the real edge (drafting.py, verdicts.py, edge_corrections.py, as
  test_edge_fidelity drives them) at T = 0.7 and 1.3 with top_p and both penalties, against the law
  written out here by hand; controls: a cloud that ignores the output so far (no penalties) and one
  that ignores top_p. Both must fail. (A drafter's q that is not the law it drew from is
  test_edge_fidelity's temperature control.)
- Greedy through the real processes and the official openai client: penalties equal target-only
  with the same penalties, computed independently (transformers' forward with the penalties written
  out here), and differ from the unpenalised output (the penalties are applied at all); `stop` cuts
  where the target-only text first holds the stop string, streamed or not.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge import verdicts
from asyncspec.cloudedge.http_options import BadRequest, parse_options
from asyncspec.cloudedge.logprobs import NOT_ASKED
from asyncspec.cloudedge.requests import checked_verdict
from asyncspec.cloudedge.stop_strings import StopStrings, StopWatch, StreamedCut, parse_stop
from asyncspec.cloudedge.validation import message_problem
from asyncspec.decoding.drafter import PrefixDrafter
from asyncspec.models.base import DecoderState
from asyncspec.shaping import Shaping, penalised, shaping_problem
from test_edge_fidelity import (
    CONTROL_P,
    DEFAULT_CORRECTION,
    DRAFTER,
    DRAWS,
    QUERYING_CORRECTION,
    RIGHT_P,
    TARGET,
    VOCAB,
    RealEdgeRequest,
    chi_square_p_value,
)
from test_sampling_fidelity import one_thread

assert one_thread  # the fixture: imported so that it applies here too

SHAPING = Shaping(top_p=wire.f32(0.9), presence_penalty=wire.f32(0.4), frequency_penalty=wire.f32(0.7))


# ---------------------------------------------------------------- stop strings


def test_stop_cuts_at_the_earliest_match_and_holds_back_only_possible_starts():
    stops = parse_stop(["w5", " w1 w", ""])
    assert stops.strings == ("w5", " w1 w")  # empty strings ignored
    assert stops.cut("w3 w1 w9 w5") == ("w3", True)
    assert stops.cut("w3 w4") == ("w3 w4", False)
    assert stops.undecided("w3 w1") == 3  # " w1" may become " w1 w"
    assert stops.undecided("w3 w2") == 0


@pytest.mark.parametrize("seed", range(20))
def test_streamed_pieces_join_to_the_cut_text_and_never_show_a_stop_prefix(seed):
    generator = torch.Generator().manual_seed(seed)
    words = [f" w{int(i)}" for i in torch.randint(0, 6, (30,), generator=generator)]
    stops = StopStrings((" w3 w4", "w5"))
    cut, sent = StreamedCut(stops), ""
    for word in words:
        sent += cut.add(word)
        kept, _ = stops.cut("".join(words))
        assert kept.startswith(sent)
    sent += cut.finish()
    assert sent == stops.cut("".join(words))[0]


@pytest.mark.parametrize("seed", range(20))
def test_the_windowed_stop_watch_stops_where_a_whole_text_search_does(seed):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 8, (60,), generator=generator).tolist()

    def decode(ids):
        return "".join(f" w{t}" for t in ids)

    stops = StopStrings((" w6 w7", " w2 w2 w2"))
    watch = StopWatch(stops, decode)
    stopped = next((i for i, token in enumerate(tokens) if watch.add(token)), None)
    reference = next((i for i in range(len(tokens)) if stops.first_match(decode(tokens[: i + 1])) is not None), None)
    assert stopped == reference


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "x"}, "frequency_penalty"),
        ({"user": 7}, "user"),
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 9}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": 1, "stream": True}, "logprobs"),
    ],
)
def test_bad_fields_get_a_400_naming_them(body, param):
    with pytest.raises(BadRequest) as refused:
        parse_options({"prompt": "x", **body})
    assert refused.value.param == param


def test_shaping_outside_openais_ranges_is_named():
    assert shaping_problem(float("nan"), 0, 0).startswith("top_p")
    assert shaping_problem(1, float("inf"), 0).startswith("presence_penalty")
    assert shaping_problem(1, 0, True).startswith("frequency_penalty")
    assert shaping_problem(0.5, -2, 2) is None


def test_the_fields_reach_the_sampling_law_as_float32():
    options = parse_options(
        {"top_p": 0.9, "presence_penalty": -0.5, "frequency_penalty": 1, "stop": "\n", "user": "u1", "seed": 4}
    )
    assert options.sampling.shaping == Shaping(wire.f32(0.9), -0.5, 1.0)
    assert options.output.stops.strings == ("\n",) and options.output.logprobs == NOT_ASKED
    assert parse_options({"logprobs": 3}).output.logprobs == 3  # /v1/completions
    assert parse_options({"logprobs": True, "top_logprobs": 2}).output.logprobs == 2  # chat


# ---------------------------------------------------------------- the shaped law through the real edge


def shaped_by_hand(logits: torch.Tensor, history: tuple[int, ...], temperature: float) -> list[float]:
    """The law OpenAI's fields define, written out independently of shaping.py: penalties per token
    of the output so far, softmax at T, then the smallest top set of mass >= top_p."""
    counts = Counter(history)
    scores = [
        float(logits[v]) - SHAPING.frequency_penalty * counts[v] - SHAPING.presence_penalty * (counts[v] > 0)
        for v in range(VOCAB)
    ]
    weights = [math.exp(s / temperature) for s in scores]
    probs = [w / sum(weights) for w in weights]
    kept, mass = set(), 0.0
    for v in sorted(range(VOCAB), key=lambda v: (-probs[v], v)):
        if mass < SHAPING.top_p:
            kept.add(v)
            mass += probs[v]
    return [probs[v] / mass if v in kept else 0.0 for v in range(VOCAB)]


def shaped_two_token_law(temperature: float) -> torch.Tensor:
    first = shaped_by_hand(TARGET.logits_after(()), (), temperature)
    return torch.tensor(
        [[first[a] * p for p in shaped_by_hand(TARGET.logits_after((a,)), (a,), temperature)] for a in range(VOCAB)],
        dtype=torch.float64,
    )


class ShapedEdgeRequest(RealEdgeRequest):
    """test_edge_fidelity's request under SHAPING; the cloud's request holds the KV's tokens, from
    which the cloud reads each row's output so far."""

    def __init__(self, draw, temperature, correction, drafter):
        super().__init__(draw, temperature, correction, drafter)
        shaping = (SHAPING.top_p, SHAPING.presence_penalty, SHAPING.frequency_penalty)
        self.sampling = wire.Sampling(temperature, draw, *shaping)
        self.request.sampling = self.cloud_request.sampling = self.sampling

    def block(self) -> None:
        generated = list(self.request.generated)
        real_decide = verdicts.decide

        def decide(block, request, logits, greedy, counters):
            tokens = [1, *generated, *wire.unpack_ids(block.candidates)]  # prompt (1,), output, candidates
            request.state = DecoderState(tokens, 1, None, None)
            return real_decide(block, request, logits, greedy, counters)

        verdicts.decide = decide
        try:
            super().block()
        finally:
            verdicts.decide = real_decide


def shaped_law_p_value(temperature: float, correction) -> float:
    counts = torch.zeros(VOCAB, VOCAB)
    drafter = PrefixDrafter(DRAFTER, DRAFTER)
    for draw in range(DRAWS):
        first, second = ShapedEdgeRequest(draw, temperature, correction, drafter).first_two()
        counts[first, second] += 1
    law = shaped_two_token_law(temperature)
    assert (law == 0).any()  # top_p removes some outcomes: a law without it would differ
    impossible = int(counts[law == 0].sum())  # outcomes the shaped law never gives: any makes P 0
    p_value = 0.0 if impossible else chi_square_p_value(counts, law.clamp(min=1e-300))
    print(f"T={temperature} shaped: chi-square P {p_value:.3g}, {impossible} outcomes outside the law")
    return p_value


@pytest.mark.parametrize(
    ("temperature", "correction"), [(0.7, DEFAULT_CORRECTION), (1.3, QUERYING_CORRECTION)], ids=["T0.7", "T1.3"]
)
def test_the_real_edge_follows_the_shaped_target(temperature, correction):
    assert shaped_law_p_value(temperature, correction) > RIGHT_P


def test_a_cloud_that_forgets_the_output_so_far_fails(monkeypatch):
    """The control of the penalties' history: every row penalised as if nothing was generated."""
    monkeypatch.setattr(verdicts, "row_histories", lambda block, request, candidates: [[]] * (len(candidates) + 1))
    assert shaped_law_p_value(1.3, QUERYING_CORRECTION) < CONTROL_P


def test_a_cloud_that_ignores_top_p_fails(monkeypatch):
    """The control of the nucleus: the target's law penalised and tempered but never truncated."""
    monkeypatch.setattr(
        verdicts,
        "shaped_probabilities",
        lambda logits, t, shaping, histories: torch.softmax(penalised(logits, histories, shaping) / t, dim=-1),
    )
    assert shaped_law_p_value(0.7, DEFAULT_CORRECTION) < CONTROL_P


def test_an_honest_unshaped_drafter_still_gives_the_shaped_law(monkeypatch):
    """The drafter's shaping raises acceptance; exactness rests on q being the law it drew from,
    whatever that law is (here the drafter's own, untruncated and unpenalised)."""
    real_propose = PrefixDrafter.propose

    def unshaped(self, *args, **kwargs):
        return real_propose(self, *args, **{**kwargs, "shaping": Shaping()})

    monkeypatch.setattr(PrefixDrafter, "propose", unshaped)
    assert shaped_law_p_value(1.3, QUERYING_CORRECTION) > RIGHT_P


# ---------------------------------------------------------------- log-probabilities on the wire


def test_a_verdict_with_impossible_logprobs_is_refused():
    block_id = wire.BlockId(1, 5, 2, 0)
    block = SimpleNamespace(candidates=[3, 4])
    good = wire.Verdict(
        block_id, 1, 7, logprobs=wire.pack_probs([-0.1, -0.2]), top_ids=wire.pack_ids([3, 5, 7, 2]),
        top_logprobs=wire.pack_probs([-0.1, -1.0, -0.2, -2.0]),
    )  # fmt: skip
    values, tops = checked_verdict(good, block, 2)
    assert values == pytest.approx([-0.1, -0.2]) and [t for t, _ in tops[1]] == [7, 2]
    with pytest.raises(ValueError, match="do not match"):  # one value short of the decided tokens
        checked_verdict(replace(good, logprobs=wire.pack_probs([-0.1])), block, 2)
    with pytest.raises(ValueError, match="more alternatives"):
        checked_verdict(good, block, 1)
    assert checked_verdict(good, block, NOT_ASKED) is None
    assert message_problem(replace(good, logprobs=wire.pack_probs([0.5, -0.2]))) is not None  # above 0
    assert message_problem(replace(good, top_logprobs=wire.pack_probs([float("nan")] * 4))) is not None
    assert message_problem(good) is None
