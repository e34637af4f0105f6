"""Encoder placement: the fastest measured (dtype, threads) is chosen, cached per machine and
re-read; a pinned dtype keeps its fastest thread count; the encoder's threads are restored after it."""

from __future__ import annotations

import numpy as np
import torch

from asyncspec.models import encoder_placement
from asyncspec.models.encoder_placement import fastest, place_encoder, thread_candidates
from asyncspec.models.int8_linear import QMAX, REDUCED_WEIGHT_QMAX
from conftest import synthetic_speech, tiny_whisper


def test_fastest_candidate_wins():
    assert fastest({"fp32x1": 900.0, "fp32x2": 480.0, "bf16x1": 220.0, "bf16x2": 125.0}) == ("bf16", 2)
    assert fastest({"fp32x1": 1200.0, "bf16x1": 3300.0}) == ("fp32", 1)  # a CPU that emulates bf16
    assert fastest({"fp32x2": 531.0, "bf16x2": 1000.0, "int8x2": 315.0}) == ("int8", 2)  # capped to VNNI
    assert fastest({"bf16x2": 434.0, "int8x2": 386.0}) == ("bf16", 2)  # a lead within the noise: floats
    assert fastest({"int8x1": 600.0, "int8x2": 320.0}) == ("int8", 2)  # int8 asked for


def test_placement_is_measured_cached_and_applied(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(encoder_placement, "pays_here", lambda encoder, name: name == "bf16")
    target = tiny_whisper(torch.float32, seed=2)
    first = place_encoder(target)
    # where int8 products are slower than fp32's, auto times the float candidates only
    assert not first.cached and set(first.measured_ms) == {
        f"{d}x{t}" for d in ("fp32", "bf16") for t in thread_candidates()
    }
    assert (first.dtype, first.threads) == fastest(first.measured_ms)
    again = place_encoder(target)
    assert again.cached and again.measured_ms == first.measured_ms and again.dtype == first.dtype
    pinned = place_encoder(target, "fp32")
    assert pinned.dtype == "fp32" and all(k.startswith("fp32x") for k in pinned.measured_ms)
    target.place_encoder(pinned)
    threads_before = torch.get_num_threads()
    assert next(target.model.model.encoder.parameters()).dtype == torch.float32
    audio = synthetic_speech(2.0)
    encoded = target.encode_audio(audio)
    assert encoded.dtype == target.dtype and encoded.shape[1] == 1500
    assert torch.get_num_threads() == threads_before  # the encoder's threads are restored after it
    assert np.isfinite(encoded.float().numpy()).all()


def test_an_entry_gains_candidates_and_a_damaged_one_is_replaced(tmp_path, monkeypatch):
    import json

    from asyncspec.models.encoder_placement import _cache_file

    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(encoder_placement, "pays_here", lambda encoder, name: name == "bf16")
    target = tiny_whisper(torch.float32, seed=3)
    path = _cache_file(target)
    path.parent.mkdir(parents=True)
    floats = {"measured_ms": {"fp32x1": 1.0, "bf16x1": 2.0}, "thread_invariant": {"fp32": True, "bf16": True}}
    path.write_text(json.dumps(floats))  # what auto measured before it could time int8
    assert place_encoder(target).dtype == "fp32"  # the floats read, int8 declined and recorded
    assert json.loads(path.read_text())["declined"] == ["int8"] and place_encoder(target).cached
    pinned = place_encoder(target, "int8")  # int8 measured once, added to the entry
    assert not pinned.cached and pinned.dtype == "int8" and all(k.startswith("int8x") for k in pinned.measured_ms)
    entry = json.loads(path.read_text())
    assert entry["measured_ms"]["fp32x1"] == 1.0 and set(entry["thread_invariant"]) == {"fp32", "bf16", "int8"}
    assert place_encoder(target, "int8").cached
    auto = place_encoder(target)  # int8 timed now: one of auto's candidates (the fake 1 ms fp32 wins)
    assert "int8x1" in auto.measured_ms and auto.dtype == "fp32"
    path.write_text("{damaged")
    assert not place_encoder(target).cached and place_encoder(target).cached  # measured again, then read


def _fake_timings(names, int8_ms: float) -> dict[str, float]:
    base = {"fp32": 500.0, "bf16": 900.0, "int8": int8_ms}
    return {f"{name}x{threads}": base[name] / threads for name in names for threads in thread_candidates()}


def _record_measurements(monkeypatch) -> list[tuple[str, ...]]:
    """Fake timings (int8 fastest) in place of measuring; the list gains the candidates of each measurement."""
    timed: list[tuple[str, ...]] = []

    def measure(encoder, features, names):
        timed.append(tuple(names))
        return _fake_timings(names, 300.0)

    monkeypatch.setattr(encoder_placement, "measure", measure)
    return timed


def test_auto_takes_the_int8_encoder_where_its_products_pay_and_it_is_fastest(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    timed = _record_measurements(monkeypatch)
    monkeypatch.setattr(encoder_placement, "pays_here", lambda encoder, name: True)
    monkeypatch.setattr(encoder_placement, "weight_range", lambda: QMAX)  # 8-bit weights, as with VNNI
    placed = place_encoder(tiny_whisper(torch.float32, seed=6))
    assert timed == [("fp32", "bf16", "int8")] and placed.dtype == "int8"
    # control: where int8 products are slower than fp32's, int8 is never timed, however fast it would be
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(encoder_placement, "pays_here", lambda encoder, name: name == "bf16")
    timed.clear()
    placed = place_encoder(tiny_whisper(torch.float32, seed=6))
    assert timed == [("fp32", "bf16")] and placed.dtype == "fp32"
    assert place_encoder(tiny_whisper(torch.float32, seed=6)).cached and timed == [("fp32", "bf16")]  # decided once


def test_auto_does_not_take_a_seven_bit_int8_encoder_however_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(encoder_placement, "measure", lambda encoder, features, names: _fake_timings(names, 300.0))
    monkeypatch.setattr(encoder_placement, "pays_here", lambda encoder, name: True)
    monkeypatch.setattr(encoder_placement, "weight_range", lambda: REDUCED_WEIGHT_QMAX)
    placed = place_encoder(tiny_whisper(torch.float32, seed=8))
    assert placed.dtype == "fp32" and "7 bits" in placed.summary()
    assert place_encoder(tiny_whisper(torch.float32, seed=8), "int8").dtype == "int8"  # asked for, it runs
    # control: with 8-bit weights the same timings take int8, and nothing is reported declined
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path / "eight_bits"))
    monkeypatch.setattr(encoder_placement, "weight_range", lambda: QMAX)
    placed = place_encoder(tiny_whisper(torch.float32, seed=8))
    assert placed.dtype == "int8" and "not taken" not in placed.summary()


class _LoadedClock:
    """A fake clock and encoder passes that advance it: each pass costs its candidate's quiet ms,
    times `factor` while the first `loaded` passes run (a producer loading beside the target)."""

    def __init__(self, quiet_ms: dict[str, float], loaded: int, factor: float):
        self.now, self.passes, self.quiet_ms, self.loaded, self.factor = 0.0, 0, quiet_ms, loaded, factor

    def perf_counter(self) -> float:
        return self.now

    def candidate(self, encoder, name: str):
        def run(features):
            cost = self.quiet_ms[f"{name}x{torch.get_num_threads()}"] / 1000
            self.now += cost * (self.factor if self.passes < self.loaded else 1.0)
            self.passes += 1

        return run


def test_load_while_the_encoder_is_timed_does_not_decide_its_placement(monkeypatch):
    import types

    quiet = {f"{name}x{t}": ms / t for name, ms in (("fp32", 1414.0), ("int8", 1312.0)) for t in thread_candidates()}
    clock = _LoadedClock(quiet, loaded=3 * len(thread_candidates()), factor=1.6)  # fp32's passes, one by one
    monkeypatch.setattr(encoder_placement, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(encoder_placement, "as_candidate", clock.candidate)
    timings = encoder_placement.measure(None, torch.zeros(1, 80, 3000), ["fp32", "int8"])
    assert timings == {key: round(ms, 1) for key, ms in quiet.items()}  # each its quiet pass
    assert fastest(timings)[0] == "fp32"  # int8's 7 % lead is under the 20 % auto asks of it
    # control: the clock is live; loaded throughout, every pass is slower
    clock = _LoadedClock(quiet, loaded=10**6, factor=1.6)
    monkeypatch.setattr(encoder_placement, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(encoder_placement, "as_candidate", clock.candidate)
    timings = encoder_placement.measure(None, torch.zeros(1, 80, 3000), ["fp32", "int8"])
    assert timings == {key: round(1.6 * ms, 1) for key, ms in quiet.items()}


def test_the_int8_probe_follows_the_measured_products(monkeypatch):
    import time

    from asyncspec.models.int8_linear import Int8Linear

    encoder = tiny_whisper(torch.float32, seed=7).model.model.encoder
    real_linear, real_int8 = torch.nn.functional.linear, Int8Linear.forward

    def slow(real):
        return lambda *args: time.sleep(0.02) or real(*args)

    monkeypatch.setattr(torch.nn.functional, "linear", slow(real_linear))
    assert encoder_placement.pays_here(encoder, "int8")
    monkeypatch.setattr(torch.nn.functional, "linear", real_linear)
    monkeypatch.setattr(Int8Linear, "forward", slow(real_int8))
    assert not encoder_placement.pays_here(encoder, "int8")  # control: slow int8 products are not timed


def test_the_bf16_probe_follows_the_measured_products(monkeypatch):
    import time

    encoder = tiny_whisper(torch.float32, seed=7).model.model.encoder
    real_linear = torch.nn.functional.linear

    def slow_in(dtype):
        return lambda x, *rest: (time.sleep(0.02) if x.dtype == dtype else None) or real_linear(x, *rest)

    monkeypatch.setattr(torch.nn.functional, "linear", slow_in(torch.bfloat16))  # as where bf16 is emulated
    assert not encoder_placement.pays_here(encoder, "bf16")
    monkeypatch.setattr(torch.nn.functional, "linear", slow_in(torch.float32))
    assert encoder_placement.pays_here(encoder, "bf16")  # control: fast bf16 products are timed


def test_auto_times_bf16_only_where_its_products_pay(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    timed = _record_measurements(monkeypatch)
    monkeypatch.setattr(encoder_placement, "pays_here", lambda encoder, name: False)
    placed = place_encoder(tiny_whisper(torch.float32, seed=9))
    assert timed == [("fp32",)] and placed.dtype == "fp32"
    assert place_encoder(tiny_whisper(torch.float32, seed=9)).cached and timed == [("fp32",)]  # decided once
    # control: where bf16 products pay, bf16 is timed beside fp32
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path / "bf16"))
    monkeypatch.setattr(encoder_placement, "pays_here", lambda encoder, name: name == "bf16")
    place_encoder(tiny_whisper(torch.float32, seed=9))
    assert timed[-1] == ("fp32", "bf16")


def test_the_encoder_takes_fewer_threads_only_where_its_output_is_thread_invariant():
    from asyncspec.models.encoder_placement import EncoderPlacement, thread_candidates

    invariant = EncoderPlacement("bf16", 2, {}, thread_invariant=True)
    assert invariant.threads_for(None) == 2 and invariant.threads_for(1) == 1
    assert invariant.threads_for(max(thread_candidates()) + 1) == 2  # a count the placement never compared
    assert EncoderPlacement("bf16", 2, {}, thread_invariant=False).threads_for(1) == 2


def _encoded_fp32_after(target, measured: bool) -> torch.Tensor:
    """The encoder output of `target` placed in fp32, after measuring every float candidate or not."""
    from asyncspec.models.encoder_placement import EncoderPlacement

    if measured:
        place_encoder(target)  # auto: times fp32 and bf16 and checks both for thread invariance
    target.place_encoder(EncoderPlacement("fp32", 1, {}, thread_invariant=True))
    return target.encode_audio(synthetic_speech(2.0))


def test_measuring_the_candidates_leaves_the_encoder_as_it_was(tmp_path, monkeypatch):
    """The process that measures the placement must compute what every later process, which reads
    it, computes: measuring the bf16 candidate used to cast the encoder in place, so the fp32
    encoder then chosen ran on bf16-rounded weights in that process alone (on whisper-base, capped
    to VNNI, another text for the same file)."""
    from asyncspec.models import encoder_placement, hf_whisper

    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path / "first"))
    measuring = _encoded_fp32_after(tiny_whisper(torch.float32, seed=6), measured=True)
    reading = _encoded_fp32_after(tiny_whisper(torch.float32, seed=6), measured=False)
    assert torch.equal(measuring, reading)

    # control: candidates cast in place, as before, each as it runs (and placed without place()'s
    # refusal of a rounded encoder, test below), and the measuring process computes another output
    def cast_in_place(encoder, name):
        return encoder.to(encoder_placement.ENCODER_DTYPES[name])

    def cast_as_it_runs(encoder, name):
        return lambda features: cast_in_place(encoder, name)(features)

    monkeypatch.setattr(encoder_placement, "as_candidate", cast_as_it_runs)
    monkeypatch.setattr(encoder_placement, "pays_here", lambda encoder, name: name == "bf16")  # bf16 timed
    monkeypatch.setattr(hf_whisper, "place", cast_in_place)
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path / "control"))
    leaky = _encoded_fp32_after(tiny_whisper(torch.float32, seed=6), measured=True)
    assert not torch.equal(leaky, reading)


def test_a_rounded_encoder_is_not_placed_again():
    import pytest

    from asyncspec.models.encoder_placement import place

    encoder = tiny_whisper(torch.float32, seed=7).model.model.encoder
    place(encoder, "bf16")
    place(encoder, "bf16")  # where it is already: nothing to round
    with pytest.raises(ValueError, match="bfloat16 already"):
        place(encoder, "fp32")


def test_a_placement_timed_under_other_openmp_settings_is_not_read(tmp_path, monkeypatch):
    """The test suite runs with OMP_WAIT_POLICY=PASSIVE on busy cores; its timings must not place the
    encoder of a quiet run without it (they once kept bf16 on one thread: 687 ms a window where two
    threads take ~430). Control: the same settings read the same entry."""
    from asyncspec.models.encoder_placement import _cache_file

    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    target = tiny_whisper(torch.float32, seed=3)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    passive = _cache_file(target)
    assert _cache_file(target) == passive
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert _cache_file(target) != passive


def test_the_producers_thread_count_variable_does_not_key_the_placement_apart(tmp_path, monkeypatch):
    """An As²d process sets OMP_NUM_THREADS for its producer's worker; a target-only process does
    not. Both must read one placement (its dtype is part of the target), or a target-only run may
    compute other text than As²d's. Control: OMP_WAIT_POLICY still keys it apart."""
    from asyncspec.models import precision_choice, threads
    from asyncspec.models.encoder_placement import _cache_file

    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    target = tiny_whisper(torch.float32, seed=3)
    shapes = [(64, 64)]
    alone, precision_alone = _cache_file(target), precision_choice._cache_file(shapes)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert _cache_file(target) == alone and precision_choice._cache_file(shapes) == precision_alone
    monkeypatch.setattr(threads, "THREAD_COUNT_VARIABLES", ())  # the control: every OMP_ variable keyed
    assert _cache_file(target) != alone
    monkeypatch.undo()
    monkeypatch.setenv("ASYNCSPEC_CACHE", str(tmp_path))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert _cache_file(target) != alone and precision_choice._cache_file(shapes) != precision_alone
