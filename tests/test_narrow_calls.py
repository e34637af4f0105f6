"""Narrow decoding calls (models/narrow_check.py): a short call runs fewer rows than the engine's
width only where the self-test proved its rows bitwise a full-width call's. On the int8 engine it
is, and target-only output is the same with or without them; an engine whose rows follow the
call's width passes the rest of the self-test (every call padded to one width) but is never
narrowed (the negative control)."""

from __future__ import annotations

import pytest
import torch

from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.models.base import DecodeRequest
from asyncspec.models.narrow_check import narrower_widths, sizes_within
from asyncspec.models.selftest import check_invariance, invariance
from asyncspec.models.threads import torch_threads
from conftest import synthetic_speech, tiny_causal, tiny_whisper
from test_fixed_shape import ShapeDependentForward


class CallWidthDependentForward(ShapeDependentForward):
    """A deliberately broken engine: hidden states move by the call's width (its padded rows), as a
    kernel that blocks a narrower product otherwise would. Padded to one width, every row agrees."""

    def __call__(self, slots, ids, prompt=False, widths=None):
        return self.inner(slots, ids, prompt, widths) + 1e-2 * ids.shape[0]


class WidthLog(ShapeDependentForward):
    """Records the width of every decoding call the engine makes (and changes nothing)."""

    def __init__(self, forward):
        super().__init__(forward)
        self.widths: list[int] = []

    def __call__(self, slots, ids, prompt=False, widths=None):
        if not prompt:
            self.widths.append(ids.shape[0])
        return self.inner(slots, ids, prompt, widths)


def test_narrower_widths_and_the_probe_sizes():
    assert narrower_widths(8) == [1, 2, 3, 4, 5, 6, 7] and narrower_widths(1) == [] and narrower_widths(3) == [1, 2]
    assert sizes_within(4, 11) == [1, 2, 3, 4, 1] and sizes_within(1, 3) == [1, 1, 1]
    assert all(max(sizes_within(width, 11)) <= width for width in (1, 2, 4))


def whisper_request(decoder, seed: int):
    return decoder.request(synthetic_speech(2.0, seed=seed), max_new_tokens=24)


@pytest.mark.parametrize("family", ["causal", "whisper"])
def test_int8_targets_decode_short_calls_narrow_and_target_only_output_is_unchanged(family):
    make = tiny_causal if family == "causal" else tiny_whisper
    target = make("int8", seed=21)
    request = DecodeRequest((5, 9, 14, 2), max_new_tokens=24) if family == "causal" else whisper_request(target, 21)
    with torch_threads(1):
        padded = METHODS["target"](target, None, request, DecodeConfig()).tokens  # no verdict yet: full width
        report = invariance(target, use_cache=False, wide_threads=2)
        assert report.passed and report.narrow_widths == (1, 2, 3, 4, 5, 6, 7), report.summary()
        assert target.engine.narrow == {1: (1, 2, 3, 4, 5, 6, 7), 2: (1, 2, 3, 4, 5, 6, 7)}
        log = target.engine.forward = WidthLog(target.engine.forward)
        narrow = METHODS["target"](target, None, request, DecodeConfig()).tokens
    assert narrow == padded and len(narrow) > 8
    assert set(log.widths) == {1}  # one token per call, each call one row
    assert target.engine.decoding_width(3) == 3 and target.engine.decoding_width(8) == 8
    with torch_threads(3):  # a thread count the check did not run at: full width
        assert target.engine.decoding_width(1) == 8


def test_the_negative_control_an_engine_whose_rows_follow_the_call_width_is_never_narrowed():
    for target in (tiny_causal("int8", seed=22), tiny_whisper("int8", seed=22)):
        target.engine.forward = CallWidthDependentForward(target.engine.forward)
        report = check_invariance(target)
        assert report.passed, report.summary()  # padded to one width, every call agrees
        assert report.narrow_widths == () and "calls of 1 row(s)" in report.narrow_difference, report.summary()
        target.invariance = None
        invariance(target, use_cache=False)
        assert target.engine.decoding_width(1) == target.call_width


def test_a_failed_verdict_narrows_nothing():
    target = tiny_causal("int8", seed=23)
    report = check_invariance(target)
    failed = type(report)(**{**report.__dict__, "passed": False})
    assert report.narrowing(report.threads) == (1, 2, 3, 4, 5, 6, 7) and failed.narrowing(report.threads) == ()


def test_the_self_test_runs_its_own_calls_at_full_width_whatever_was_proven_before():
    """A width-dependent engine left with narrow widths set (as if proven earlier): the check still
    passes, its reference and partitions padded to full width; the control, the same calls left
    narrow, fails. The engine's narrow widths are restored afterwards."""
    from asyncspec.models.selftest import _check_invariance

    target = tiny_causal("int8", seed=24)
    target.engine.forward = CallWidthDependentForward(target.engine.forward)
    left = {torch.get_num_threads(): (1, 2, 4)}
    target.engine.narrow = dict(left)
    assert check_invariance(target).passed
    assert target.engine.narrow == left
    assert not _check_invariance(target, None, None).passed  # the control: calls left narrow


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_engines_are_never_narrowed(dtype):
    target = tiny_causal(dtype, seed=25)
    report = invariance(target, use_cache=False)
    assert report.passed and report.narrow_threads == () and report.narrow_widths == ()
    assert target.engine.decoding_width(1) == target.call_width
