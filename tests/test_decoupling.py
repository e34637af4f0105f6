"""As²d's decoupling, observed: the producer publishes byte-identical candidate batches for the same
audio whatever the target decides, and the same comparison catches a producer that reads the
target's committed text (a deliberately leaky one). Then the target side's own half: about a
request the producer process is sent its Start, and nothing else until the target has finished
(a target side that messages the producer mid-decode is caught)."""

from __future__ import annotations

import pytest
import torch

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.ondevice.buffer import CandidateBuffer, PublishedBatch
from asyncspec.ondevice.messages import Stop

pytestmark = pytest.mark.real


class SuppressingTarget:
    """Another target: Whisper base whose greedy rule never emits `banned` (its text differs from
    the plain model's there, while every call it makes is the model's own)."""

    def __init__(self, target, banned: int):
        self.target, self.banned = target, banned

    def __getattr__(self, name):
        return getattr(self.target, name)

    def greedy(self, logits: torch.Tensor) -> list[int]:
        logits = logits.clone()
        logits[..., self.banned] = float("-inf")
        return self.target.greedy(logits)


class CompleteDrafting:
    """The producer, but `finish` first lets it publish the whole request (no Stop cuts it short):
    two decodes then have whole publications to compare, whatever their speed."""

    def __init__(self, producer):
        self.producer = producer

    def start(self, audio) -> CandidateBuffer:
        return self.producer.start(audio)

    def finish(self, buffer: CandidateBuffer) -> None:
        while not buffer.finished and buffer.channel is not None:
            if buffer.channel.poll(0.5):
                buffer.accept(buffer.channel.recv())
        self.producer.finish(buffer)


class LeakyDrafting(CompleteDrafting):
    """A leaky producer: it sees the target's committed tokens (through the proposer the target
    asks at each round) and publishes from them, as a drafter prompted with the target's text would."""

    def start(self, audio) -> CandidateBuffer:
        buffer = super().start(audio)
        honest = buffer.make_proposer
        seen: list[int] = []

        class Reading:
            def __init__(self, call_sizes=None):
                self.inner = honest(call_sizes)

            def propose(self, root, committed, room):
                seen[:] = committed  # the target's text so far
                return self.inner.propose(root, committed, room)

            def advance(self, accepted):
                self.inner.advance(accepted)

        buffer.make_proposer = Reading
        buffer.seen = seen
        return buffer

    def finish(self, buffer: CandidateBuffer) -> None:
        super().finish(buffer)
        now = buffer.batches[-1].published if buffer.batches else 0.0
        offset = len(buffer.tokens)
        buffer.publish(PublishedBatch(buffer.request_id, "leaky", offset, tuple(buffer.seen), None, now, now))


def publications(buffer_batches: list[PublishedBatch]) -> list[tuple]:
    """Everything a batch says except its request number and clock times: bytes to compare."""
    return [(b.source, b.offset, b.tokens, b.confidences, b.start_s, b.end_s) for b in buffer_batches]


@pytest.fixture(scope="module")
def case(whisper_base):
    """One LibriVox clip (7 s, two producer chunks) and two targets whose texts differ."""
    request = whisper_base.request(load_audio(librivox_clips()[0].path))
    plain = METHODS["target"](whisper_base, None, request, DecodeConfig()).tokens
    other = SuppressingTarget(whisper_base, banned=plain[len(plain) // 2])
    other_truth = METHODS["target"](other, None, request, DecodeConfig()).tokens
    assert other_truth != plain  # two targets that really decide differently
    return request, [(whisper_base, plain), (other, other_truth)]


def drafted_under(targets, producer, request) -> list[list[tuple]]:
    """Each target decodes the request with As²d (exactly, checked); the producer's publications."""
    out = []
    for target, truth in targets:
        seen: list[list[PublishedBatch]] = []
        result = METHODS["as2d"](target, _Recorded(producer, seen), request, DecodeConfig())
        assert result.tokens == truth and result.stats.as2d.producer_failure is None
        out.append(publications(seen[0]))
    return out


class _Recorded:
    """Keeps the buffer's batches once the producer has finished the request."""

    def __init__(self, producer, seen: list):
        self.producer, self.seen = producer, seen

    def start(self, audio):
        return self.producer.start(audio)

    def finish(self, buffer):
        self.producer.finish(buffer)
        self.seen.append(list(buffer.batches))


def test_publications_are_byte_identical_under_two_targets_and_a_leaky_producer_is_caught(producer, case):
    request, targets = case
    honest = drafted_under(targets, CompleteDrafting(producer), request)
    assert len(honest[0]) >= 2 and honest[0] == honest[1]  # the same batches, whichever target decoded
    leaky = drafted_under(targets, LeakyDrafting(producer), request)
    assert leaky[0] != leaky[1]  # the comparison fails for a producer that reads the target's text


class CommandLog:
    """The producer's command pipe, recorded in order with the moment the target finished."""

    def __init__(self, producer, monkeypatch):
        self.events: list[str] = []
        send = producer._commands.send
        monkeypatch.setattr(producer._commands, "send", lambda m: (self.events.append(type(m).__name__), send(m))[1])
        finish = producer.finish
        monkeypatch.setattr(producer, "finish", lambda b: (self.events.append("target finished"), finish(b))[1])


def test_the_target_side_sends_the_producer_nothing_before_it_finishes(producer, case, monkeypatch, whisper_base):
    """Event order, not clocks: Start, then the target finishes, then (if still drafting) Stop. A
    target side that tells the producer something mid-decode (here a Stop at its first verify call)
    breaks the order."""
    request, [(target, truth), _] = case
    log = CommandLog(producer, monkeypatch)
    assert METHODS["as2d"](target, producer, request, DecodeConfig()).tokens == truth
    assert log.events[:2] == ["Start", "target finished"] and set(log.events[2:]) <= {"Stop"}

    class Telling:
        def __getattr__(self, name):
            return getattr(target, name)

        def extend(self, state, tokens):
            if not log.events.count("Stop"):
                producer._commands.send(Stop(producer._next_id))  # the leak: a message mid-decode
            return target.extend(state, tokens)

    log.events.clear()
    assert METHODS["as2d"](Telling(), producer, request, DecodeConfig()).tokens == truth
    assert log.events[:2] != ["Start", "target finished"]
