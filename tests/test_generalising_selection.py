"""Selection that generalises (profiling/generalising.py) on hand-built catalogs whose answers are
known, and the real-speech development split (data/real_devset.py)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from types import SimpleNamespace

import pytest

from asyncspec.audio import load_audio
from asyncspec.data.real_devset import (
    CMU_DATA,
    CMU_RECORDINGS,
    LIBRIVOX_PAIRS,
    LIBRIVOX_TEMPOS,
    TEMPOS,
    assemble_held_out,
    assemble_real_dev_set,
    recording_of,
)
from asyncspec.profiling.costs import IDLE, CostProfile
from asyncspec.profiling.generalising import (
    REPLAY_NOISE,
    cross_validate,
    rank_correlation,
    robust_choice,
    slowest_of,
    windows_won,
)
from asyncspec.profiling.selection import Catalog, Entry, Selection, rank, replay_catalog
from asyncspec.profiling.trajectory import Publication, WindowTrajectory, fingerprint

A, B, C = Entry("a", 1), Entry("b", 1), Entry("c", 1)


def catalog(seconds: dict[Entry, list[float]], tokens: list[int]) -> Catalog:
    """A catalog of windows with `tokens[i]` tokens, each entry's replayed seconds given."""
    trajectories = [SimpleNamespace(tokens=[0] * n, window=f"w{i}") for i, n in enumerate(tokens)]
    return Catalog(trajectories, seconds, target_seconds=[1.0] * len(tokens), fallbacks=0)  # type: ignore[arg-type]


def test_one_long_window_does_not_carry_the_choice_within_noise():
    # a wins one long window by a little more than everything b wins on four short ones: pooled, a
    # is ahead by under REPLAY_NOISE, and b is faster on four windows of five
    seconds = {A: [10.0, 1.1, 1.1, 1.1, 1.1], B: [10.5, 1.0, 1.0, 1.0, 1.0]}
    tokens = [100, 10, 10, 10, 10]
    cat = catalog(seconds, tokens)
    pooled = dict(rank(cat))
    assert pooled[A] > pooled[B] > pooled[A] * (1 - REPLAY_NOISE)
    assert windows_won(cat, [A, B], list(range(5))) == {A: 1, B: 4}
    assert robust_choice(cat, [A, B]) == B
    # the control: beyond the noise the pooled figure decides, however many windows the other wins
    far = catalog({A: [8.0, 1.1, 1.1, 1.1, 1.1], B: [10.5, 1.0, 1.0, 1.0, 1.0]}, tokens)
    assert robust_choice(far, [A, B]) == A


def test_cross_validation_scores_each_recording_with_the_choice_made_without_it():
    # r1 (one window) favours a; r2 and r3 favour b; c is never best
    seconds = {A: [1.0, 2.0, 2.0, 2.0, 2.0], B: [3.0, 1.0, 1.0, 1.0, 1.0], C: [3.0] * 5}
    cat = catalog(seconds, [10] * 5)
    groups = ["r1", "r2", "r2", "r3", "r3"]
    result = cross_validate(cat, groups, [A, B, C], default=C)
    # without r2 (or r3), a and b tie pooled (30 tokens in 5 s) and b wins two windows of three
    assert result.groups == {"r1": B, "r2": B, "r3": B}
    assert result.out_of_fold_tps == pytest.approx(50 / (3 + 2 + 2))  # r1 pays b's 3 s
    assert result.default_tps == pytest.approx(50 / 15)
    # the control: a fold's choice is made without it; selecting on r1 itself would have chosen a
    assert robust_choice(cat, [A, B, C], [0]) == A
    with pytest.raises(ValueError, match="two recordings"):
        cross_validate(cat, ["r1"] * 5, [A, B], default=C)


def test_rank_correlation_of_identical_reversed_and_partial_rankings():
    assert rank_correlation([A, B, C], [A, B, C]) == pytest.approx(1.0)
    assert rank_correlation([A, B, C], [C, B, A]) == pytest.approx(-1.0)
    assert rank_correlation([A, B, C], [B, A]) == pytest.approx(-1.0)  # only the common entries count


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox is not installed")
def test_the_real_development_split_is_cmu_speech_and_read_speech_at_other_rates(tmp_path):
    paths = assemble_real_dev_set(tmp_path)
    assert len(paths) == len(CMU_RECORDINGS) * len(TEMPOS) + len(LIBRIVOX_PAIRS) * len(LIBRIVOX_TEMPOS)
    by_recording: dict[str, dict[float, float]] = {}
    for path in paths:
        seconds = len(load_audio(path)) / 16000
        tempo = float(path.stem.split("-tempo")[1])
        by_recording.setdefault(recording_of(path.name + "#0"), {})[tempo] = seconds
    assert set(by_recording) == {*CMU_RECORDINGS, *LIBRIVOX_PAIRS}
    for durations in by_recording.values():  # faster speech is shorter, in proportion to the tempo
        assert durations[0.85] / durations[1.15] == pytest.approx(1.15 / 0.85, rel=0.02)
    assert all(1.0 not in rates for rates in by_recording.values())  # the recorded rates are the test sets'
    assert 11 < by_recording["librivox-a"][0.85] < 13  # 7.1 s + 3.0 s of read speech, slowed
    held_out = assemble_held_out(tmp_path / "held-out")
    assert [p.name for p in held_out] == [f"{name}-tempo1.wav" for name in CMU_RECORDINGS]
    assert 9 < len(load_audio(held_out[0])) / 16000 < 14  # five card names with pauses, as recorded
    development = {fingerprint(load_audio(p)) for p in paths}
    assert not development & {fingerprint(load_audio(p)) for p in held_out}


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox is not installed")
def test_a_split_assembled_twice_is_the_same_audio(tmp_path):
    first, second = assemble_held_out(tmp_path / "a"), assemble_held_out(tmp_path / "b")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    # the control: sox's own default (random dither after an effect) would not have been
    source = str(CMU_DATA / CMU_RECORDINGS["cards"][0])
    made = []
    for name in ("x.wav", "y.wav"):
        subprocess.run(["sox", source, "-b", "16", str(tmp_path / name), "tempo", "-s", "0.85"], check=True)
        made.append((tmp_path / name).read_bytes())
    assert made[0] != made[1]


def test_a_choice_that_did_not_generalise_across_recordings_is_refused():
    default = Entry("d", 6)
    better_in_sample = Selection(A, 140.0, default, 136.0, out_of_fold_tps=128.0)
    assert "out of fold" in better_in_sample.refusal
    # the controls: one that also held out of fold is deployed, and so is the default itself
    assert replace(better_in_sample, out_of_fold_tps=137.0).refusal is None
    assert Selection(default, 136.0, default, 136.0, out_of_fold_tps=120.0).refusal is None
    assert replace(better_in_sample, out_of_fold_tps=None).refusal is None  # one recording: no CV to go by


def test_a_producer_that_keeps_pace_only_on_some_runs_loses_to_one_that_is_early():
    # "late" publishes the whole output in one batch 0.3 s after decoding begins (it started 0.4 s
    # before): in the first collection the target decodes alone until then, verifies it all in one
    # call and finishes soonest. "early" published a worse draft (two wrong tokens: three calls)
    # 0.5 s before decoding began. In the second collection "late" ran slower and arrived at 0.6 s.
    tokens = tuple(range(10, 30))
    wrong = list(tokens)
    wrong[2] = wrong[10] = 99
    early = [Publication(0, tuple(wrong), None, -0.6, -0.5, 1)]

    def window(late_at: float) -> WindowTrajectory:
        late = [Publication(0, tokens, None, -0.4, late_at, 1)]
        return WindowTrajectory("w", "d", "f", 4, 448, 100, list(tokens), "eos", {"late": late, "early": early})

    profile = CostProfile(
        target="t", dtype="bf16", verify={IDLE: {0: {k: [0.1 + 0.005 * k] for k in range(1, 26)}}},
        align_s=0.0, gap_s=0.0, target_gap_s=0.0, delivery_s=0.0,
    )  # fmt: skip
    entries = [Entry("late", 19), Entry("early", 19)]
    fast, slow = ([window(at)] for at in (0.3, 0.6))
    first, second = (replay_catalog(c, profile, ["late", "early"], budgets=(19,)) for c in (fast, slow))
    assert robust_choice(first, entries) == Entry("late", 19)  # the control: one collection, late wins
    both = slowest_of([first, second])
    assert both.seconds[Entry("late", 19)] == second.seconds[Entry("late", 19)]
    assert both.seconds[Entry("early", 19)] == first.seconds[Entry("early", 19)]
    assert robust_choice(both, entries) == Entry("early", 19)
    # a producer that kept pace on both runs is not charged for a slowdown nobody measured
    assert robust_choice(slowest_of([first, first]), entries) == Entry("late", 19)
    other = [replace(fast[0], fingerprint="g")]
    with pytest.raises(ValueError, match="different windows"):
        slowest_of([first, replay_catalog(other, profile, ["late", "early"], budgets=(19,))])


def test_a_win_by_less_than_the_replays_noise_is_a_tie():
    # on every window a is faster than b by 1 %: below the noise, both count the window as won
    seconds = {A: [1.0, 2.0, 3.0], B: [1.01, 2.02, 3.03]}
    assert windows_won(catalog(seconds, [10] * 3), [A, B], [0, 1, 2]) == {A: 3, B: 3}
    # the control: by 5 % the faster one alone wins it
    wide = {A: [1.0, 2.0, 3.0], B: [1.05, 2.1, 3.15]}
    assert windows_won(catalog(wide, [10] * 3), [A, B], [0, 1, 2]) == {A: 3, B: 0}
