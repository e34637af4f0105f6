"""As²d: buffer, alignment, accounting, exactness with every kind of producer, and decoupling."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
import torch

from asyncspec.audio import load_audio
from asyncspec.data.librivox import librivox_clips
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models.base import DecodeRequest
from asyncspec.ondevice import align
from asyncspec.ondevice.accounting import account, merge
from asyncspec.ondevice.align import realign, spelt_alike
from asyncspec.ondevice.buffer import CandidateBuffer, PublishedBatch, paid_for
from asyncspec.ondevice.chunking import chunk_bounds
from asyncspec.ondevice.messages import Done
from conftest import synthetic_speech, tiny_causal, tiny_whisper


class TimedChannel:
    """Releases scripted batches once their delay (seconds after start) has passed."""

    def __init__(self, script: list[tuple[float, PublishedBatch]]):
        self.start = time.perf_counter()
        self.pending = list(script)

    def poll(self, timeout: float = 0.0) -> bool:
        return bool(self.pending) and time.perf_counter() - self.start >= self.pending[0][0]

    def recv(self):
        return self.pending.pop(0)[1]


class ScriptedProducer:
    """In-process stand-in for a producer: publishes fixed tokens in batches on a schedule."""

    def __init__(
        self, tokens: list[int], batch: int = 4, delay_s: float = 0.0, first_s: float = 0.0, sure: float | None = None
    ):
        self.tokens, self.batch, self.delay_s, self.first_s = tokens, batch, delay_s, first_s
        self.sure = sure  # every token's confidence (None: a source without confidences)
        self.started = 0

    def start(self, audio):
        self.started += 1
        now = time.perf_counter()
        script = [
            (
                self.first_s + i // self.batch * self.delay_s,
                PublishedBatch(
                    self.started, "scripted", i, tuple(self.tokens[i : i + self.batch]), self._sure(i), now, now
                ),
            )
            for i in range(0, len(self.tokens), self.batch)
        ]
        return CandidateBuffer(self.started, TimedChannel(script))

    def _sure(self, start: int) -> tuple[float, ...] | None:
        return None if self.sure is None else (self.sure,) * len(self.tokens[start : start + self.batch])

    def finish(self, buffer):
        buffer.finished = True


def _reference(target, request):
    return METHODS["target"](target, None, request, DecodeConfig())


@functools.cache
def whisper_case(seed: int):
    target = tiny_whisper(torch.float32, seed=seed, multilingual=True)
    request = target.request(synthetic_speech(4.0, seed=seed), max_new_tokens=40)
    return target, request, _reference(target, request).tokens


def _producers(truth: list[int]) -> dict[str, ScriptedProducer]:
    rng = np.random.default_rng(0)
    shifted = truth[:5] + [1000] + truth[5:12] + truth[13:]  # one insertion, one deletion
    return {
        "perfect": ScriptedProducer(truth),
        "garbage": ScriptedProducer(rng.integers(300, 50000, size=60).tolist()),
        "nothing": ScriptedProducer([]),
        "slow": ScriptedProducer(truth, batch=4, delay_s=0.2, first_s=0.1),
        "shifted": ScriptedProducer(shifted),
        "unsure": ScriptedProducer(shifted, sure=0.1),
    }


@pytest.mark.parametrize("kind", ["perfect", "garbage", "nothing", "slow", "shifted", "unsure"])
@pytest.mark.parametrize("budget", [1, 3, 8, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_as2d_equals_target_only_with_any_producer(seed, kind, budget):
    target, request, truth = whisper_case(seed)
    result = METHODS["as2d"](target, _producers(truth)[kind], request, DecodeConfig(budget=budget))
    assert result.tokens == truth
    assert max(result.stats.call_widths) <= budget + 1
    if kind == "perfect":
        assert result.stats.acceptance == 1.0
        assert result.stats.target_calls <= -(-len(truth) // (budget + 1)) + 1
    if kind == "nothing":
        assert result.stats.call_widths == [1] * result.stats.target_calls


def test_shifted_stream_is_realigned_and_mostly_used(monkeypatch):
    target = tiny_causal(torch.float32, seed=7)
    target.eos_ids = frozenset()
    request = DecodeRequest((1, 2, 3, 4), max_new_tokens=40)
    truth = _reference(target, request).tokens
    shifted = truth[:5] + [(truth[5] + 1) % 95] + truth[5:]  # the producer has an extra token

    def coverage() -> float:
        result = METHODS["as2d"](target, ScriptedProducer(shifted, batch=40), request, DecodeConfig(budget=8))
        assert result.tokens == truth
        return result.stats.as2d.coverage

    aligned = coverage()
    monkeypatch.setattr(align, "realign", lambda stream, expected, root, history, **_: expected)
    assert aligned > 0.75  # the shift costs about one round, not the rest of the stream
    assert aligned > coverage() + 0.3  # without realignment the shift ruins the rest


def test_realign_rules():
    stream = [10, 11, 12, 13, 14, 11, 15]
    assert realign(stream, 2, 12, [11, 12]) == 2  # already in place
    assert realign(stream, 2, 13, [99, 13]) == 3  # the target skipped a candidate
    assert realign(stream, 3, 12, [11, 12]) == 2  # the target inserted a token
    assert realign(stream, 4, 11, [14, 11]) == 5  # repeated token: the copy after its predecessor
    assert realign(stream, 2, 77, [11, 77]) == 2  # no match: keep the slot (substitution)
    assert realign(stream, 9, 12, [11, 12]) == 9  # beyond what is published: unchanged
    assert realign(stream, 9, 12, [11, 12], complete=True) == 2  # ...unless that is all there is


def test_a_far_match_follows_the_longest_committed_context_not_the_nearest_pair():
    """The committed text is ... 5 6 7 8 9; the stream has 5 6 7 8 9 some 20 slots behind the
    cursor and a lone 8 9 some 12 ahead. The pair ahead matches two tokens, the run behind five."""
    filler = list(range(100, 140))
    stream = [5, 6, 7, 8, 9] + filler[:20] + [50] + filler[20:31] + [8, 9] + filler[31:]
    history = [1, 2, 5, 6, 7, 8, 9]
    expected = 25
    assert realign(stream, expected, 9, history) == 4
    # the control: the former rule, the nearest (previous, root) pair, jumps ahead to the lone 8 9
    nearest_pair = min((s for s in range(1, len(stream)) if stream[s - 1 : s + 1] == [8, 9]), key=lambda s: abs(s - 25))
    assert nearest_pair == 38


def test_a_root_spelt_otherwise_beside_the_guess_takes_the_cursor():
    spellings = {1: "the", 2: "hair", 3: "was", 4: "hare", 5: "once", 6: "boasting", 7: "tort", 8: "torto"}
    spelling = spellings.__getitem__
    stream = [1, 3, 2, 3, 5, 6]  # " the was hair was once boasting": the guess (slot 1) is off by one
    assert realign(stream, 1, 4, [1, 4], spelling=spelling) == 2  # " hare" heard as " hair"
    assert realign(stream, 1, 4, [1, 4]) == 1  # without spellings: the guess stays
    assert realign([1, 7, 3], 2, 8, [1, 8], spelling=spelling) == 1  # " torto" written " Tort"
    assert realign([1, 2, 3, 5, 4], 1, 4, [1, 4], spelling=spelling) == 4  # the exact word first, 3 slots on
    assert spelt_alike("hare", "hair") and spelt_alike("tort", "tortoise") and spelt_alike("he", "she")
    assert not spelt_alike("", "a") and not spelt_alike("cat", "dog")


def test_buffer_orders_batches_refuses_other_requests_and_reads_fast():
    buffer = CandidateBuffer(2)
    with pytest.raises(ValueError, match="routed"):  # the demux routes per request: a stray batch is a bug
        buffer.publish(PublishedBatch(1, "s", 0, (5, 6), None, 0.0, 0.0))
    buffer.publish(PublishedBatch(2, "s", 0, (7, 8, 9), (0.9, 0.3, 0.8), 0.0, 0.1))
    assert buffer.tokens == [7, 8, 9]
    assert buffer.ready(0, 8, min_confidence=0.4) == [7, 8]  # ASP: the low-confidence token ends the read
    with pytest.raises(ValueError, match="offset"):
        buffer.publish(PublishedBatch(2, "s", 7, (1,), None, 0.0, 0.2))
    timeouts = []

    class CountingChannel(TimedChannel):
        def poll(self, timeout: float = 0.0) -> bool:
            timeouts.append(timeout)
            return super().poll(timeout)

    buffer.channel = CountingChannel([])
    for _ in range(1000):
        assert buffer.refresh() == 0
    # on the target's path: one non-blocking poll per refresh when nothing is there, never a wait
    assert timeouts == [0] * 1000 and buffer.refreshes >= 1000


def test_a_cut_for_confidence_keeps_the_candidates_the_call_pays_for():
    buffer = CandidateBuffer(1)
    buffer.publish(PublishedBatch(1, "s", 0, tuple(range(20)), (0.9, 0.3) + (0.9,) * 18, 0.0, 0.1))
    assert buffer.ready(0, 7, 0.4) == [0, 1]  # the control: without blocks the unsure token ends the read
    assert buffer.ready(0, 7, 0.4, call_sizes=(8,)) == list(range(7))  # root + 7 rows: one block either way
    assert buffer.ready(0, 15, 0.4, call_sizes=(8,)) == list(range(7))  # a second block would cost: cut there
    assert buffer.ready(9, 15, 0.4, call_sizes=(8,)) == list(range(9, 20))  # no unsure token: the limit holds
    assert [paid_for(n, (8,)) for n in (0, 1, 7, 8, 15)] == [7, 7, 7, 15, 15]
    assert paid_for(3, None) == 3
    # narrow calls (the int8 engine): the cut rounds up to the smallest size holding the root and it
    assert buffer.ready(0, 7, 0.4, call_sizes=(1, 2, 4, 8)) == [0, 1, 2]  # root + 2 rows: a 4-row call
    assert [paid_for(n, (1, 2, 4, 8)) for n in (0, 1, 2, 3, 4, 7, 8)] == [0, 1, 3, 3, 7, 7, 15]


def test_an_unsure_producer_still_fills_the_fixed_call(monkeypatch):
    target, request, truth = whisper_case(0)
    assert target.call_width == 8
    result = METHODS["as2d"](target, ScriptedProducer(truth, sure=0.1), request, DecodeConfig(budget=7))
    assert result.tokens == truth and result.stats.acceptance == 1.0
    assert result.stats.target_calls <= -(-len(truth) // 8) + 1
    # the control: cut at every unsure token, as without blocks, each call verifies one candidate
    monkeypatch.setattr("asyncspec.decoding.as2d.call_sizes", lambda target: None)
    cut = METHODS["as2d"](target, ScriptedProducer(truth, sure=0.1), request, DecodeConfig(budget=7))
    assert cut.tokens == truth and max(cut.stats.call_widths) == 2


def test_accounting_identity_and_overlap():
    producer = [(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]
    verifier = [(0.2, 0.4), (1.5, 3.5)]
    stages = account(producer, verifier, 0.0, 5.0)
    assert merge(producer) == [(0.0, 2.0), (3.0, 4.0)]
    assert stages.producer_s == pytest.approx(3.0) and stages.verifier_s == pytest.approx(2.2)
    assert stages.overlap_s == pytest.approx(0.2 + 0.5 + 0.5)
    assert stages.residual_s == pytest.approx(1.0)  # (4, 5) is idle
    assert stages.total_s == pytest.approx(stages.producer_s + stages.verifier_s - stages.overlap_s + stages.residual_s)


def test_chunks_cover_the_audio_and_cut_at_quiet_points():
    t = np.arange(16000 * 7) / 16000
    samples = (0.5 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    samples[int(2.4 * 16000) : int(2.5 * 16000)] = 0.0  # a pause near the first nominal boundary
    bounds = chunk_bounds(samples, 2.56)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(samples)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert 2.4 * 16000 <= bounds[0][1] <= 2.5 * 16000


@pytest.mark.real
def test_the_chunked_producer_recognises_four_chunks_a_call_and_publishes_each_in_order(whisper_base):
    """~20 s of LibriVox speech with 4 s of silence inside: every audible chunk is published once,
    in audio order with consecutive offsets, CHUNKS_PER_CALL chunks sharing one recogniser call
    (one start time), the silent chunk not at all; one call at a time where history prompts each."""
    from dataclasses import replace

    from asyncspec.models.offline import ct2_model_dir
    from asyncspec.ondevice import sources

    clips = [load_audio(clip.path) for clip in librivox_clips()[:3]]
    audio = np.concatenate([clips[0], np.zeros(4 * 16000, np.float32), *clips[1:]])
    spec = sources.ProducerSpec(
        model_dir=str(ct2_model_dir("whisper-tiny.en")),
        target_tokenizer_json=whisper_base.tokenizer.backend.to_str(),
    )
    audible = [
        bounds
        for bounds in chunk_bounds(audio, spec.chunk_s)
        if np.abs(audio[bounds[0] : bounds[1]]).max() >= sources.SILENT_CHUNK_PEAK
    ]
    assert len(audible) < len(chunk_bounds(audio, spec.chunk_s))  # the silence is a chunk of its own
    for use_history, per_call in ((False, sources.CHUNKS_PER_CALL), (True, 1)):
        published: list[PublishedBatch] = []
        source = sources.ChunkedWhisperSource(replace(spec, use_history=use_history))
        source.run(3, audio, published.append, lambda: False)
        assert [(b.start_s * 16000, b.end_s * 16000) for b in published] == [tuple(map(float, c)) for c in audible]
        assert [b.offset for b in published] == [
            sum(len(b.tokens) for b in published[:i]) for i in range(len(published))
        ]
        calls = [
            len([b for b in published if b.started == started])
            for started in dict.fromkeys(b.started for b in published)
        ]
        assert calls == [min(per_call, len(audible) - i) for i in range(0, len(audible), per_call)]
        assert all(b.request_id == 3 for b in published)
        assert "Dashwood" in whisper_base.tokenizer.decode([t for b in published for t in b.tokens])


@pytest.mark.real
@pytest.mark.parametrize("kind, clips", [("ct2-chunk", 3), ("autoregressive", 1)])
def test_real_producer_is_decoupled_and_output_is_exact(whisper_base, kind, clips):
    from asyncspec.models.offline import ct2_model_dir
    from asyncspec.ondevice.producer import ProducerProcess, ProducerSpec

    spec = ProducerSpec(
        kind=kind,
        model_dir=str(ct2_model_dir("whisper-tiny.en")),
        target_tokenizer_json=whisper_base.tokenizer.backend.to_str(),
    )
    producer = ProducerProcess(spec)
    try:
        for clip in librivox_clips()[:clips]:
            request = whisper_base.request(load_audio(clip.path))
            truth = _reference(whisper_base, request).tokens
            result = METHODS["as2d"](whisper_base, producer, request, DecodeConfig())
            assert result.tokens == truth, clip.path.name
            assert result.stats.as2d.producer_messages_before_end == 0  # nothing from the target side
            assert result.stats.as2d.published > 0
            accounting = result.stats.as2d.accounting
            assert accounting["total_s"] == pytest.approx(
                accounting["producer_s"]
                + accounting["verifier_s"]
                - accounting["overlap_s"]
                + accounting["residual_s"],
                abs=1e-5,
            )
    finally:
        producer.close()
    assert not producer.process.is_alive()


@pytest.mark.real
def test_the_profile_load_drafts_the_window_again_without_encoding_it_again(whisper_base, monkeypatch):
    """The cost profile's concurrent sweep runs beside `steady_load`: the autoregressive producer
    drafting, as natively beside a verifying target, not re-encoding. Each cycle must draft what a
    fresh run drafts (the rollback restores the prefilled state); the control skips the rollback."""
    from asyncspec.ondevice.sources import AutoregressiveWhisperSource, ProducerSpec

    spec = ProducerSpec(kind="autoregressive", target_tokenizer_json=whisper_base.tokenizer.backend.to_str())
    source = AutoregressiveWhisperSource(spec)
    drafter, audio = source.drafter, load_audio(librivox_clips()[0].path)
    real_extend, real_prefill, real_rollback = drafter.extend, drafter.prefill, drafter.rollback
    fed: list[list[tuple[int, int]]] = [[]]
    prefills = []

    def extend(state, tokens):  # (the position each token was fed at, the token)
        fed[-1].extend((state.length + i, token) for i, token in enumerate(tokens))
        return real_extend(state, tokens)

    def prefill(request):
        prefills.append(request)
        return real_prefill(request)

    def drafted_in_three_cycles(rollback) -> list[list[tuple[int, int]]]:
        del fed[1:], prefills[:]
        fed.append([])
        monkeypatch.setattr(drafter, "rollback", lambda state, length: (rollback(state, length), fed.append([])))
        source.steady_load(audio, lambda: len(fed) > 4)
        return fed[1:4]

    monkeypatch.setattr(drafter, "extend", extend)
    monkeypatch.setattr(drafter, "prefill", prefill)
    source.run(0, audio, lambda batch: None, lambda: False)
    fresh = fed[0]
    assert len(fresh) > 10
    assert drafted_in_three_cycles(real_rollback) == [fresh] * 3
    assert len(prefills) == 1  # encoded once for every cycle
    # the control: without the rollback the second cycle drafts on after the first one's text
    assert drafted_in_three_cycles(lambda state, length: None)[1][0][0] == fresh[-1][0] + 1


def test_festival_development_set(tmp_path):
    from asyncspec.data.devset import synthesize_dev_set

    paths = synthesize_dev_set(tmp_path)
    assert len(paths) == 12
    assert all(5.0 < len(load_audio(path)) / 16000 < 30.0 for path in paths)


def test_the_producer_starts_when_the_request_arrives_before_the_target_prefills():
    """Drafting begins at the request's arrival, beside the target's encoder and prompt prefill;
    it reads only the audio (the decoupling invariant), so starting early changes no output."""
    target, request, truth = whisper_case(1)
    events = []

    class RecordingTarget:
        def __getattr__(self, name):
            return getattr(target, name)

        def prefill(self, request):
            events.append("target prefill")
            return target.prefill(request)

    class RecordingProducer(ScriptedProducer):
        def start(self, audio):
            events.append("producer start")
            assert audio is request.audio  # the audio, nothing of the target's
            return super().start(audio)

    result = METHODS["as2d"](RecordingTarget(), RecordingProducer(truth), request, DecodeConfig())
    assert events == ["producer start", "target prefill"]
    assert result.tokens == truth


@pytest.mark.parametrize("told_mid_decode", [False, True])
def test_commands_the_producer_read_before_the_end_are_counted(told_mid_decode):
    """The worker's log of what it read (its Done) is counted against the decode's end: a Stop read
    after the end counts 0, one read mid-decode counts 1 (a scripted producer reports either; the
    real worker's order is test_decoupling.py's)."""
    target, request, truth = whisper_case(1)

    class Reporting(ScriptedProducer):
        def start(self, audio):
            self.began = time.perf_counter()
            return super().start(audio)

        def finish(self, buffer):
            after = time.perf_counter()
            told = self.began if told_mid_decode else after
            buffer.accept(Done(buffer.request_id, after, (("start", self.began), ("stop", told))))

    result = METHODS["as2d"](target, Reporting(truth), request, DecodeConfig())
    assert result.tokens == truth
    assert result.stats.as2d.producer_messages_before_end == int(told_mid_decode)
