"""Replay, cost profiles, selection and the deployed configuration (seed 000 §4.3, App. D.3)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from asyncspec.commands.replay import bracketed, per_window, run_to_run
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.errors import InputError
from asyncspec.ondevice.buffer import CandidateBuffer, PublishedBatch
from asyncspec.profiling import deployed as deployed_module
from asyncspec.profiling.costs import CONCURRENT, IDLE, CostProfile, monotone_fit
from asyncspec.profiling.deployed import As2dSettings, DeployedConfig, ProducerChoice, deployed_as2d, save_deployed
from asyncspec.profiling.replay import (
    CausalityError,
    NativePricer,
    ProfilePricer,
    replay_as2d,
    replay_target_only,
)
from asyncspec.profiling.selection import Entry, ensure_disjoint, oracle, rank, replay_catalog, select
from asyncspec.profiling.trajectory import (
    Publication,
    WindowTrajectory,
    load_trajectories,
    reference_trajectory,
    save_trajectories,
)
from conftest import synthetic_speech, tiny_whisper
from test_as2d import TimedChannel


def costs(idle: dict[int, float], concurrent: dict[int, float] | None = None, **loop) -> CostProfile:
    verify = {IDLE: {0: {k: [v] for k, v in idle.items()}}}
    if concurrent:
        verify[CONCURRENT] = {0: {k: [v] for k, v in concurrent.items()}}
    settings = {"align_s": 0.001, "gap_s": 0.002, "target_gap_s": 0.0, "delivery_s": 0.0} | loop
    return CostProfile(target="t", dtype="bf16", verify=verify, **settings)


def trajectory(publications, tokens=(10, 11, 12, 13, 14), finish="eos", limit=100) -> WindowTrajectory:
    return WindowTrajectory(
        window="w",
        dataset="d",
        fingerprint="f",
        prompt_len=4,
        max_length=448,
        limit=limit,
        tokens=list(tokens),
        finish_reason=finish,
        sources={"s": publications},
    )


ONE_BATCH = [Publication(0, (10, 11, 12, 13, 14), None, 0.05, 0.15, 1)]
IDLE_COSTS = {1: 0.1, 2: 0.11, 3: 0.12, 4: 0.13}


def test_replay_of_a_synthetic_trajectory_gives_the_hand_computed_time():
    # rounds: K=1 [0.001, 0.101] gap -> 0.103; K=1 [0.104, 0.204] -> 0.206; the batch (published
    # 0.15) is visible at 0.206: root 12 at slot 2, candidates 13 14, K=3 [0.207, 0.327], both
    # accepted, EOS next -> 0.329
    run = replay_as2d(trajectory(ONE_BATCH), "s", 3, ProfilePricer(costs(IDLE_COSTS)))
    assert run.widths == [1, 1, 3]
    assert run.accepted == 2
    assert run.time_s == pytest.approx(0.329, abs=1e-12)
    assert run.tps == pytest.approx(5 / 0.329)
    accounting = run.accounting
    assert accounting.producer_s == pytest.approx(0.10)
    assert accounting.verifier_s == pytest.approx(0.101 + 0.101 + 0.121)
    assert accounting.overlap_s == pytest.approx((0.101 - 0.05) + (0.15 - 0.103))  # rounds start at align
    assert accounting.total_s == pytest.approx(
        accounting.producer_s + accounting.verifier_s - accounting.overlap_s + accounting.residual_s
    )


def test_replay_charges_concurrent_costs_while_the_producer_works():
    # the second call starts at 0.104, inside the producer's [0.05, 0.15): charged 0.2 instead of 0.1
    profile = costs(IDLE_COSTS, {1: 0.2, 2: 0.22, 3: 0.24, 4: 0.26})
    run = replay_as2d(trajectory(ONE_BATCH), "s", 3, ProfilePricer(profile))
    assert run.time_s == pytest.approx(0.429, abs=1e-12)


def test_replay_of_target_only_and_the_length_limit():
    profile = costs(IDLE_COSTS, target_gap_s=0.01)
    assert replay_target_only(trajectory([]), ProfilePricer(profile, target_only=True)).time_s == pytest.approx(
        5 * 0.11
    )
    capped = trajectory([], limit=5, finish="length")  # no call after the fifth (last) token
    assert replay_target_only(capped, ProfilePricer(profile, target_only=True)).time_s == pytest.approx(4 * 0.11)
    run = replay_as2d(trajectory(ONE_BATCH, limit=5, finish="length"), "s", 8, ProfilePricer(profile))
    assert run.n_tokens == 5 and run.widths == [1, 1, 3]


def test_a_candidate_is_never_used_before_it_is_published():
    late = [Publication(0, (10, 11, 12, 13, 14), None, 0.0, 5.0, 1)]
    run = replay_as2d(trajectory(late), "s", 4, ProfilePricer(costs(IDLE_COSTS)))
    assert run.widths == [1, 1, 1, 1, 1]  # all five tokens are decoded long before t = 5 s

    class EarlyPricer(ProfilePricer):
        def visible(self, publication, refresh, now):
            return True  # claims everything has arrived: replay must refuse to read the future

    with pytest.raises(CausalityError):
        replay_as2d(trajectory(late), "s", 4, EarlyPricer(costs(IDLE_COSTS)))


class DelayedProducer:
    """Publishes the given tokens in batches; each batch's published time is its real release time."""

    def __init__(self, tokens: list[int], batch: int, delay_s: float):
        self.tokens, self.batch, self.delay_s, self.started = tokens, batch, delay_s, 0

    def start(self, audio):
        self.started += 1
        now = time.perf_counter()
        script = []
        for n, i in enumerate(range(0, len(self.tokens), self.batch)):
            due = (n + 1) * self.delay_s
            batch = PublishedBatch(
                self.started,
                "delayed",
                i,
                tuple(self.tokens[i : i + self.batch]),
                None,
                now + n * self.delay_s,
                now + due,
            )
            script.append((due, batch))
        return CandidateBuffer(self.started, TimedChannel(script))

    def finish(self, buffer):
        buffer.finished = True


@pytest.mark.parametrize("budget", [2, 5])
def test_replay_with_native_durations_reproduces_the_native_run(budget):
    target = tiny_whisper(torch.float32, seed=3, multilingual=True)
    samples = synthetic_speech(4.0, seed=3)
    request = target.request(samples, max_new_tokens=40)
    reference = METHODS["target"](target, None, request, DecodeConfig())
    truth = reference.tokens
    noisy = truth[:6] + [1000] + truth[6:20] + truth[21:]  # an insertion and a deletion to realign across
    native = METHODS["as2d"](target, DelayedProducer(noisy, 4, 0.01), request, DecodeConfig(budget=budget))
    assert native.tokens == truth
    t = reference_trajectory("w", "d", samples, target, reference, request)
    t.add_native("as2d:delayed", native, budget)

    replayed = replay_as2d(t, "delayed", budget, NativePricer(t.native["as2d:delayed"]))
    assert replayed.widths == native.stats.call_widths
    assert replayed.time_s == pytest.approx(native.stats.decode_s, abs=1e-9)
    for key, value in native.stats.as2d.accounting.items():
        assert getattr(replayed.accounting, key) == pytest.approx(value, abs=2e-6), key
    own_target = replay_target_only(t, NativePricer(t.native["target"]))
    assert own_target.time_s == pytest.approx(reference.stats.decode_s, abs=1e-9)


def test_trajectories_and_profiles_round_trip(tmp_path):
    t = trajectory(ONE_BATCH)
    save_trajectories(tmp_path / "t.json", [t])
    assert load_trajectories(tmp_path / "t.json")[0] == t
    profile = costs(IDLE_COSTS, {1: 0.2, 2: 0.22, 3: 0.24, 4: 0.26})
    profile.save(tmp_path / "p.json")
    loaded = CostProfile.load(tmp_path / "p.json")
    assert loaded.verify == profile.verify and loaded.concurrent_ratio(2) == pytest.approx(2.0)
    assert loaded.saving(2) == pytest.approx(1 - 0.11 / 0.2)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError):
        CostProfile.load(tmp_path / "bad.json")
    with pytest.raises(InputError):
        load_trajectories(tmp_path / "p.json")


def test_an_unprofiled_width_is_an_error_not_free():
    with pytest.raises(InputError, match="K=9"):
        costs(IDLE_COSTS).verify_s(9, 0)


def test_profile_interpolates_between_offsets():
    profile = costs(IDLE_COSTS)
    profile.verify[IDLE][64] = {k: [2 * v] for k, v in IDLE_COSTS.items()}
    assert profile.verify_s(1, 32) == pytest.approx(0.15)
    assert profile.verify_s(1, 100) == pytest.approx(0.2)


def test_selection_and_oracle_on_replayed_catalogs():
    # window a: the batch is ready at once -> large budgets win; window b: nothing is published
    # 27 tokens: budget 8 commits 9 per round (3 rounds), every smaller budget needs 4 or more
    ready = trajectory([Publication(0, tuple(range(10, 37)), None, 0.0, 0.0, 1)], tokens=range(10, 37))
    never = trajectory([], tokens=range(10, 37))
    profile = costs({k: 0.1 + 0.01 * (k - 1) for k in range(1, 10)})
    catalog = replay_catalog([ready, never], profile, ["s"], range(1, 9))
    (best, best_tps), *_ = rank(catalog)
    assert best.budget == 8
    oracle_tps, per_window = oracle(catalog)
    assert oracle_tps >= best_tps
    assert per_window[1].budget == 1  # nothing to verify: every budget costs the same, the smallest wins ties


def test_the_default_is_scored_beside_a_catalog_without_it_and_a_slower_choice_is_refused():
    ready = trajectory([Publication(0, tuple(range(10, 37)), None, 0.0, 0.0, 1)], tokens=range(10, 37))
    profile = costs({k: 0.1 + 0.01 * (k - 1) for k in range(1, 10)})
    default = Entry("s", 8)
    catalog = replay_catalog([ready], profile, ["s"], range(1, 3), also=(default,))
    assert set(catalog.seconds) == {Entry("s", 1), Entry("s", 2), default}
    restricted = select(catalog, [Entry("s", 1), Entry("s", 2)], default)
    assert restricted.chosen == Entry("s", 2) and restricted.default_tps > restricted.chosen_tps
    assert "slower than the built-in default s budget 8" in restricted.refusal
    # the control: with the default among the candidates nothing faster is missed, nothing is refused
    full = select(catalog, [Entry("s", 1), Entry("s", 2), default], default)
    assert full.chosen == default and full.refusal is None


def test_selection_refuses_test_windows_from_the_development_split():
    deployed = DeployedConfig("ct2-chunk@4s", "whisper-tiny.en", 6, 30.0, {"fingerprints": ["a", "b"]})
    ensure_disjoint(deployed, ["c", "d"])
    with pytest.raises(InputError, match="development"):
        ensure_disjoint(deployed, ["c", "b"])


def test_the_deployed_configuration_fills_unset_options(tmp_path, monkeypatch):
    monkeypatch.setenv(deployed_module.CONFIG_ENV, str(tmp_path / "as2d.json"))
    assert deployed_as2d(None, None, None) == As2dSettings("ct2-chunk", 4.0, None)
    save_deployed(DeployedConfig("ct2-chunk@6s", "whisper-tiny.en", 9, 30.0))
    deployed = deployed_as2d(None, None, None)
    assert (deployed.producer, deployed.chunk_s, deployed.budget) == ("ct2-chunk", 6.0, 9)
    assert deployed_as2d("ct2-chunk", None, 3).budget == 3  # an explicit --budget wins
    assert deployed_as2d(None, 2.0, None).chunk_s == 2.0  # so does an explicit --chunk-s
    assert deployed_as2d("autoregressive", None, None).budget is None  # the selected budget belongs to its own producer
    (tmp_path / "as2d.json").write_text(json.dumps({"nonsense": 1}))
    with pytest.raises(InputError, match="select-budget"):
        deployed_as2d(None, None, None)


def test_producer_choice_names():
    assert ProducerChoice.parse("ct2-chunk@6s") == ProducerChoice("ct2-chunk", 6.0)
    assert ProducerChoice.parse("autoregressive").name == "autoregressive"
    with pytest.raises(InputError):
        ProducerChoice.parse("psychic")


def test_replay_validates_at_as2d_default_budget():
    from asyncspec.cli import build_parser
    from asyncspec.decoding.as2d import DEFAULT_BUDGET

    assert build_parser().parse_args(["replay", "--validate"]).budget == DEFAULT_BUDGET


def _run(window: str, native: float, replay: float, target_native: float = 40.0) -> dict:
    return {"window": window, "dataset": "d", "tokens": 10, "native_tps": native, "replay_tps": replay,
            "target_native_tps": target_native, "target_replay_tps": 40.0}  # fmt: skip


def test_validation_compares_each_windows_median_run_with_replay():
    # w1's three native runs: one slow draw of the machine (60) beside two at 100; replay says 100
    rows = [_run("w1", 100, 100), _run("w1", 60, 100, 30.0), _run("w1", 100, 100), _run("w2", 50, 55)]
    windows = {w["window"]: w for w in per_window(rows)}
    assert windows["w1"]["runs"] == 3 and windows["w1"]["tps_error_pct"] == 0.0
    assert windows["w2"]["tps_error_pct"] == pytest.approx(10.0)
    # the control: the slow run alone would have counted as a 67 % error
    assert per_window([rows[1]])[0]["tps_error_pct"] == pytest.approx(100 * (100 / 60 - 1), abs=1e-3)
    # a single run's noise: w1's runs lie 0, 40 and 0 % from their median; w2's one run is not counted
    assert run_to_run(rows, "native_tps") == pytest.approx(40 / 3, abs=1e-3)
    assert run_to_run(rows, "target_native_tps") == pytest.approx(25 / 3, abs=1e-3)
    assert run_to_run([rows[0], rows[3]], "native_tps") is None


def test_call_costs_are_fitted_to_grow_with_the_width():
    # K=5's two calls were slow (noise): unfitted, 5 rows would cost more than 8 in the same block
    samples = {1: [0.020, 0.022], 4: [0.033, 0.033], 5: [0.040, 0.036], 8: [0.033, 0.034], 9: [0.06, 0.06]}
    fitted = monotone_fit(samples)
    assert list(fitted.values()) == sorted(fitted.values())
    assert fitted[5] == fitted[8] == pytest.approx((0.040 + 0.036 + 0.033 + 0.034) / 4)
    assert fitted[1] == pytest.approx(0.021) and fitted[9] == pytest.approx(0.06)  # in order already: kept
    profile = CostProfile("t", "bf16", {IDLE: {0: samples}}, 0.0, 0.0, 0.0, 0.0)
    assert profile.verify_s(5, 0) == profile.verify_s(8, 0) < 0.038  # the control: 5's own mean is 0.038
    assert profile.mean_over_offsets(5)[0] == pytest.approx(0.038)  # the measured figures stay as measured


def test_a_profile_pooled_with_a_later_one_prices_the_middle():
    before, after = costs({1: 0.020, 8: 0.030}), costs({1: 0.030, 8: 0.040})
    pooled = before.pooled_with(after)
    assert pooled.verify_s(1, 0) == pytest.approx(0.025) and pooled.verify_s(8, 0) == pytest.approx(0.035)
    assert before.verify_s(1, 0) == 0.020 and after.verify_s(1, 0) == 0.030  # neither is changed
    with pytest.raises(InputError, match="same modes, offsets and widths"):
        before.pooled_with(costs({1: 0.03}))


def test_validation_blocks_are_priced_between_the_costs_before_and_after_them():
    # the machine slows down by 10 ms a call per block; each block is run, then the costs re-measured
    events: list[str] = []

    def blocks():
        for index in range(3):
            events.append(f"block {index}")
            yield index

    def recalibrate(before: CostProfile) -> CostProfile:
        events.append("calibrate")
        return costs({1: before.verify_s(1, 0) + 0.010})

    priced = [(block, profile.verify_s(1, 0)) for block, profile in bracketed(blocks(), costs({1: 0.020}), recalibrate)]
    assert events == ["block 0", "calibrate", "block 1", "calibrate", "block 2", "calibrate"]
    assert priced == [(0, pytest.approx(0.025)), (1, pytest.approx(0.035)), (2, pytest.approx(0.045))]
    # the control: one profile measured before the first block prices them all at its start
    assert [p.verify_s(1, 0) for _, p in bracketed(range(3), costs({1: 0.020}), None)] == [0.020] * 3
