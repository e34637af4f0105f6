"""Sampling fidelity beyond the first token: the joint law of two speculated tokens, from serial sd
and from the cloud's accept loop, must be the target's own two-token law. Each comes with negative
controls (a wrong residual, a bonus drawn from the wrong row) whose TV must be far above the noise
floor, so the test is known to be able to fail.

Target and drafter are table models over a three-token vocabulary: the first output token is
certain (x1 = 0), so (x2, x3) are the first two tokens that speculation decides, and their joint
law p(x2 | x1) p(x3 | x1, x2) has nine cells. With a budget of one candidate per round, full
acceptance makes x3 the bonus token, a rejection makes x2 the residual draw."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge import verdicts as verdicts_module
from asyncspec.cloudedge.cloud import CloudRequest, CloudVerifier
from asyncspec.cloudedge.correction import Ask, CorrectionPolicy, CorrectionSession, Decided, FidelityBudget
from asyncspec.decoding import speculative
from asyncspec.decoding.result import DecodeConfig
from asyncspec.decoding.standard_sd import decode_standard_sd
from asyncspec.models.base import DecodeRequest, DecoderState
from asyncspec.verify import probabilities
from conftest import word_tokenizer

VOCAB = 3
DRAWS = 40_000
TEMPERATURE = 1.0
CONTROL_FACTOR = 5  # a negative control must land at least this many noise floors above zero


class TableDecoder:
    """A Decoder whose next-token law is a fixed table of the output so far (no network): cheap
    enough for tens of thousands of decodes, exact to compare against. Outputs missing from the
    table (deeper than any test looks) get the uniform law."""

    def __init__(self, name: str, laws: dict[tuple[int, ...], list[float]]):
        self.name = name
        self.tokenizer = word_tokenizer(VOCAB)
        self.eos_ids: frozenset[int] = frozenset()  # no end of sequence: every run commits max_new_tokens
        self.vocab_size = VOCAB
        self.max_length = 64
        self.laws = {output: torch.tensor(p).log() for output, p in laws.items()}

    def logits_after(self, output: tuple[int, ...]) -> torch.Tensor:
        return self.laws.get(output, torch.zeros(VOCAB))

    def prefill(self, request: DecodeRequest) -> DecoderState:
        return DecoderState(list(request.prompt_ids), len(request.prompt_ids), None, self.logits_after(()))

    def extend(self, state: DecoderState, tokens) -> torch.Tensor:
        rows = []
        for token in tokens:
            state.tokens.append(int(token))
            rows.append(self.logits_after(tuple(state.tokens[state.prompt_len :])))
        state.next_logits = rows[-1]
        return torch.stack(rows)

    def rollback(self, state: DecoderState, length: int) -> None:
        del state.tokens[length:]
        state.next_logits = None

    def greedy(self, logits: torch.Tensor) -> list[int]:
        return logits.reshape(-1, VOCAB).argmax(-1).tolist()


# p and q disagree at every position, and p(. | x1, x2) differs from p(. | x1) for every x2, so a
# wrong residual or a bonus from the wrong row each move the joint law by far more than the noise
TARGET = TableDecoder(
    "target",
    {
        (): [1.0, 0.0, 0.0],  # x1 = 0 for sure
        (0,): [0.5, 0.3, 0.2],
        (0, 0): [0.1, 0.2, 0.7],
        (0, 1): [0.6, 0.3, 0.1],
        (0, 2): [0.3, 0.5, 0.2],
    },
)
DRAFTER = TableDecoder(
    "drafter",
    {
        (0,): [0.1, 0.3, 0.6],
        (0, 0): [0.6, 0.3, 0.1],
        (0, 1): [0.1, 0.3, 0.6],
        (0, 2): [0.2, 0.2, 0.6],
    },
)
REQUEST = DecodeRequest(prompt_ids=(1,), max_new_tokens=3)


def law(decoder: TableDecoder, output: tuple[int, ...]) -> torch.Tensor:
    return probabilities(decoder.logits_after(output), TEMPERATURE).double()


def two_token_law() -> torch.Tensor:
    """p(x2, x3 | x1 = 0) as a [VOCAB, VOCAB] table."""
    first = law(TARGET, (0,))
    return torch.stack([first[a] * law(TARGET, (0, a)) for a in range(VOCAB)])


@pytest.fixture(autouse=True)
def one_thread():
    """Tens of thousands of softmaxes over three entries: a thread pool only adds wake-ups (40x
    slower on a busy two-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def noise_floor(law_table: torch.Tensor, draws: int = DRAWS) -> float:
    """Four times the expected TV between a law and its empirical distribution from `draws`
    samples (E|count_i/N - p_i| ~ sqrt(2 p_i (1 - p_i) / (pi N)), halved and summed), the
    convention of test_cloudedge_correction."""
    cells = law_table.flatten().double()
    return 4 * 0.5 * float(torch.sqrt(2 * cells * (1 - cells) / (torch.pi * draws)).sum())


def tv(counts: torch.Tensor, law_table: torch.Tensor) -> float:
    return 0.5 * float((counts.double() / counts.sum() - law_table).abs().sum())


def empirical(sample_pair) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for draw in range(DRAWS):
        second, third = sample_pair(draw)
        counts[second, third] += 1
    return counts


def assert_control_fails(name: str, sample_pair) -> None:
    """A negative control: its two-token law must land CONTROL_FACTOR noise floors away from the target's."""
    truth = two_token_law()
    # measured at 40,000 draws: 5.6 to 9.8 floors; at 10,000 the floor doubles and none would pass
    measured, floor = tv(empirical(sample_pair), truth), noise_floor(truth)
    print(f"{name}: TV {measured:.4f}, noise floor {floor:.4f}")
    assert measured > CONTROL_FACTOR * floor


def bonus_from_the_first_row(real_probabilities):
    """A deliberate off-by-one: every row after the first is replaced by the first, so the bonus
    after full acceptance is drawn from the law of the position before it."""

    def wrong(logits, temperature, *shaping):
        p = real_probabilities(logits, temperature, *shaping)
        return p[:1].expand_as(p).clone()

    return wrong


# ---------------------------------------------------------------- serial sd


def sd_pair(budget: int):
    def sample(draw: int) -> tuple[int, int]:
        # even seeds: the drafter's generator (seed + 1) never replays another draw's target stream
        config = DecodeConfig(temperature=TEMPERATURE, seed=2 * draw, budget=budget)
        first, second, third = decode_standard_sd(TARGET, DRAFTER, REQUEST, config).tokens
        assert first == 0
        return second, third

    return sample


@pytest.mark.parametrize("budget", [1, 2])
def test_sd_two_token_continuations_follow_the_target(budget):
    truth = two_token_law()
    measured = tv(empirical(sd_pair(budget)), truth)
    print(f"sd budget {budget}: TV {measured:.4f}, noise floor {noise_floor(truth):.4f}")
    assert measured < noise_floor(truth)


def test_sd_with_a_wrong_residual_fails(monkeypatch):
    from asyncspec import verify

    monkeypatch.setattr(verify, "residual", lambda p, q: p)  # sample from p instead of [p - q]+
    assert_control_fails("sd, wrong residual", sd_pair(budget=1))


def test_sd_with_the_bonus_from_the_wrong_row_fails(monkeypatch):
    monkeypatch.setattr(speculative, "probabilities", bonus_from_the_first_row(speculative.probabilities))
    assert_control_fails("sd, bonus from the wrong row", sd_pair(budget=1))


# ---------------------------------------------------------------- the cloud's accept loop


class EdgeOfOneRequest:
    """What the edge does around the cloud's `verdicts.decide` and `verdicts.correction`, without
    sockets: draft one candidate from the drafter's law, send it with q(candidate), settle the verdict, and run a
    rejection's correction session against the cloud's answers (exact: budget 0, first K = 1, so
    the session has to ask for proposals or the full distribution)."""

    def __init__(self, draw: int, correct_with_zero_q: bool = False, first_proposals: int = 0, modes=None):
        self.cloud = CloudVerifier(TARGET)  # only its decision and correction logic is exercised here
        self.sampling = wire.Sampling(temperature=TEMPERATURE, seed=draw)
        self.request = CloudRequest(
            prompt_len=1, sampling=self.sampling, first_k=1, epoch=0, state=None, first_proposals=first_proposals
        )
        self.modes = modes if modes is not None else Counter()  # how each rejection was settled
        self.generator = torch.Generator().manual_seed(10_000_019 * (draw + 1))
        self.correct_with_zero_q = correct_with_zero_q
        self.output = [0]  # x1 is certain

    def continuation(self) -> tuple[int, int]:
        while len(self.output) < 3:
            self.round()
        return self.output[1], self.output[2]

    def round(self) -> None:
        q = law(DRAFTER, tuple(self.output)).float()
        candidate = int(torch.multinomial(q, 1, generator=self.generator))
        block_id = wire.BlockId(request=1, base=len(self.output), n=1, config=self.sampling.digest())
        block = wire.Block(block_id, self.output[-1], wire.pack_ids([candidate]), wire.pack_probs(q[[candidate]]))
        logits = torch.stack([TARGET.logits_after(tuple(self.output)), TARGET.logits_after((*self.output, candidate))])
        verdict = verdicts_module.decide(block, self.request, logits, self.cloud.target.greedy, self.cloud.counters)
        if verdict.settled_by:
            self.modes["in the verdict, by the cloud"] += 1
        self.output += [candidate][: verdict.accepted]
        self.output.append(verdict.token if verdict.token >= 0 else self.correct(block_id, verdict, q))

    def correct(self, block_id: wire.BlockId, verdict: wire.Verdict, q: torch.Tensor) -> int:
        q = torch.zeros_like(q) if self.correct_with_zero_q else q  # the control: [p - 0]+ = p
        session = CorrectionSession(q, FidelityBudget(0.0), CorrectionPolicy(), self.generator)
        attached = None
        if verdict.proposal_ids:
            unpack = wire.unpack_probs
            attached = (wire.unpack_ids(verdict.proposal_ids), unpack(verdict.proposal_p), unpack(verdict.proposal_u))
        support = wire.unpack_ids(verdict.support_ids)
        step = session.first(support, wire.unpack_probs(verdict.support_p), verdict.tail, attached)
        if attached is not None:
            self.modes["in the verdict, by the edge" if isinstance(step, Decided) else "after a query"] += 1
        while isinstance(step, Ask):
            query = wire.CorrectionQuery(block_id, step.kind, step.start, step.stop)
            answer = verdicts_module.correction(query, self.request.pending, self.sampling)
            ids, p = wire.unpack_ids(answer.ids), wire.unpack_probs(answer.p)
            if step.kind == "topk":
                step = session.add_support(ids, p, answer.tail)
            elif step.kind == "proposals":
                step = session.add_proposals(ids, p)
            else:
                step = session.add_full(p)
        return step.token


def test_cloud_accept_loop_two_token_continuations_follow_the_target():
    truth = two_token_law()
    measured = tv(empirical(lambda draw: EdgeOfOneRequest(draw).continuation()), truth)
    print(f"cloud accept loop: TV {measured:.4f}, noise floor {noise_floor(truth):.4f}")
    assert measured < noise_floor(truth)


def test_cloud_correction_from_p_instead_of_the_residual_fails():
    assert_control_fails(
        "cloud, correction from p", lambda draw: EdgeOfOneRequest(draw, correct_with_zero_q=True).continuation()
    )


def test_cloud_bonus_from_the_wrong_row_fails(monkeypatch):
    wrong = bonus_from_the_first_row(verdicts_module.shaped_probabilities)
    monkeypatch.setattr(verdicts_module, "shaped_probabilities", wrong)
    assert_control_fails("cloud, bonus from the wrong row", lambda draw: EdgeOfOneRequest(draw).continuation())


# ---------------------------------------------------------------- a rejection settled in the verdict


def test_rejections_settled_in_the_verdict_follow_the_target():
    """The verdict carries round 0 of exact recovery: the cloud settles a rejection itself where it can
    decide the round from q(rejected) and the bound q(v) <= 1 - q(rejected); otherwise the edge finishes
    the round with the cloud's uniforms, and only when every proposal fails does it query again. Two
    proposals per verdict, so that all three paths occur often."""
    truth, modes = two_token_law(), Counter()
    measured = tv(empirical(lambda draw: EdgeOfOneRequest(draw, first_proposals=2, modes=modes).continuation()), truth)
    print(f"settled in the verdict: TV {measured:.4f}, noise floor {noise_floor(truth):.4f}, {dict(modes)}")
    assert measured < noise_floor(truth)
    assert min(modes.values()) > DRAWS // 100 and len(modes) == 3, modes


def test_a_cloud_that_trusts_a_wrong_bound_on_q_fails(monkeypatch):
    """Negative control: a bound below q(v) (here: q(v) <= 0 for every v but the rejected one) makes the
    cloud accept the first other proposal, a draw from p instead of the residual."""
    monkeypatch.setattr(verdicts_module, "Q_BOUND_SLACK", -1.0)
    assert_control_fails(
        "settled in the verdict, wrong bound", lambda draw: EdgeOfOneRequest(draw, first_proposals=2).continuation()
    )
