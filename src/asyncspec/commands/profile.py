"""`asyncspec profile`: measure this device's cost profile on a calibration window (espeak-ng,
disjoint from development and test audio); write JSON and the R(K) plot (seed 000 Figure 8)."""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import mean

from asyncspec.audio import load_audio
from asyncspec.data.devset import calibration_audio
from asyncspec.errors import InputError
from asyncspec.models.base import DecodeRequest
from asyncspec.models.hf_whisper import WhisperBackend
from asyncspec.ondevice.producer import ProducerSpec
from asyncspec.profiling.costs import CONCURRENT, DEFAULT_OFFSETS, IDLE, CostProfile
from asyncspec.profiling.deployed import ProducerChoice
from asyncspec.profiling.measure import (
    build_profile,
    native_runs,
    sweep_verify,
    verify_timings,
)
from asyncspec.transcription.loading import make_producer, producer_spec

REPEATS = 3  # native calibration runs per method (loop costs)


@dataclass
class Calibration:
    """What a later re-calibration of the verification costs needs (block calibration)."""

    target: WhisperBackend
    request: DecodeRequest
    reference: list[int]
    load: ProducerSpec | None
    log: Callable[[str], None] = print

    def recalibrate(self, base: CostProfile, max_width: int, repetitions: int = 3) -> CostProfile:
        widths, offsets = tuple(range(1, max_width + 1)), tuple(sorted(base.verify[IDLE]))
        timings = verify_timings(
            self.target, self.request, self.reference, self.load, widths, offsets, repetitions, 1, self.log
        )
        return replace(base, verify=timings)


def run(args) -> int:
    out = Path(args.out)
    profile, calibration = measure_profile(args, out)
    profile.save(out / "profile.json")
    beside = transformers_costs(args, calibration)
    (out / "profile_transformers.json").write_text(json.dumps(beside, indent=1))
    print_profile(profile, beside["v_ms"])
    plot_saving(profile, out / "profile_saving.png", beside["v_ms"])
    print(f"wrote {out / 'profile.json'}, {out / 'profile_transformers.json'}, {out / 'profile_saving.png'}")
    return 0


def transformers_costs(args, calibration: Calibration) -> dict:
    """V(K) of the same model and dtype on transformers' own forward (idle, same widths and
    offsets): what the fixed-shape engine costs or saves against it. Its self-test verdict too."""
    from asyncspec.models.registry import load_decoder
    from asyncspec.models.selftest import invariance

    model = load_decoder(args.model, args.dtype, engine="transformers")
    widths, offsets = _sweep_shape(args)
    print("profile: the same idle sweep on transformers' forward, for comparison")
    timings = sweep_verify(
        model, calibration.request, calibration.reference, widths, offsets, args.repetitions, args.warmup, print
    )
    v_ms = {k: 1000 * mean(s for by_k in timings.values() for s in by_k[k]) for k in widths}
    return {"engine": "transformers", "dtype": model.precision, "v_ms": v_ms, "self_test": asdict(invariance(model))}


def measure_profile(args, out: Path, target: WhisperBackend | None = None) -> tuple[CostProfile, Calibration]:
    from asyncspec.models.registry import load_decoder

    widths, offsets = _sweep_shape(args)
    choice = ProducerChoice.parse(args.producer)
    loaded = target or load_decoder(args.model, args.dtype)
    if not isinstance(loaded, WhisperBackend):
        raise InputError(f"{args.model} is not a speech model")
    target = loaded
    audio = load_audio(calibration_audio(out / "calibration"))
    request = target.request(audio)
    print(f"profile: {target.describe()}; calibration window {len(audio) / 16000:.1f} s")
    target_runs = native_runs("target", target, None, request, REPEATS)
    reference = target_runs[0].tokens
    tokenizer_json = target.tokenizer.backend.to_str()
    spec = producer_spec(choice.kind, choice.chunk_s, args.producer_model, args.dtype, tokenizer_json)
    load = None if args.idle_only else spec
    timings = verify_timings(target, request, reference, load, widths, offsets, args.repetitions, args.warmup, print)
    producer = make_producer(choice.kind, choice.chunk_s, args.producer_model, args.dtype, target)
    try:
        as2d_runs = native_runs("as2d", target, producer, request, REPEATS)
    finally:
        producer.close()
    drafter = load_decoder(args.drafter, args.dtype, engine="transformers")
    sd_runs = native_runs("sd", target, drafter, request, 2)
    profile = build_profile(target, target.precision, timings, as2d_runs, target_runs[1:], sd_runs, choice.chunk_s)
    return profile, Calibration(target, request, reference, load)


def profile_settings(args, producer: str, max_width: int) -> Namespace:
    """`profile`'s default settings for a measurement made on behalf of another command."""
    return Namespace(
        model=args.model,
        producer=producer,
        producer_model=args.producer_model,
        drafter=args.drafter,
        dtype=args.dtype,
        max_width=max_width,
        offsets=",".join(map(str, DEFAULT_OFFSETS)),
        repetitions=5,
        warmup=1,
        idle_only=False,
    )


def _sweep_shape(args) -> tuple[tuple[int, ...], tuple[int, ...]]:
    try:
        offsets = tuple(int(o) for o in args.offsets.split(","))
    except ValueError as error:
        raise InputError(f"--offsets must be a comma list of integers, got {args.offsets!r}") from error
    if args.max_width < 1 or args.repetitions < 1 or args.warmup < 0 or any(o < 0 for o in offsets):
        raise InputError("--max-width and --repetitions must be >= 1, --warmup and --offsets >= 0")
    return tuple(range(1, args.max_width + 1)), offsets


def print_profile(profile: CostProfile, transformers_ms: dict[int, float] | None = None) -> None:
    concurrent = bool(profile.verify.get(CONCURRENT))
    print(
        f"{'K':>3} {'idle ms':>9} {'sd':>6} {'R(K)':>7}"
        + (f" {'concurrent ms':>14} {'ratio':>6}" if concurrent else "")
        + (f" {'transformers ms':>16}" if transformers_ms else "")
    )
    for k in profile.widths:
        idle, spread = profile.mean_over_offsets(k)
        line = f"{k:>3} {1000 * idle:>9.1f} {1000 * spread:>6.1f} {100 * profile.saving(k):>6.1f}%"
        if concurrent:
            line += f" {1000 * profile.mean_over_offsets(k, CONCURRENT)[0]:>14.1f} {profile.concurrent_ratio(k):>6.3f}"
        if transformers_ms:
            line += f" {transformers_ms[k]:>16.1f}"
        print(line)
    print(
        f"per round: align {1000 * profile.align_s:.2f} ms, loop {1000 * profile.gap_s:.2f} ms, "
        f"lead {1000 * profile.lead_s:.1f} ms; target-only loop {1000 * profile.target_gap_s:.2f} ms/token; "
        f"delivery {1e6 * profile.delivery_s:.0f} us; sd drafting {1000 * profile.drafter_call_s:.1f} ms + "
        f"{1000 * profile.drafter_step_s:.1f} ms/call"
    )


def plot_saving(profile: CostProfile, path: Path, transformers_ms: dict[int, float] | None = None) -> None:
    from asyncspec.plots import plt, save

    widths = [k for k in profile.widths if k > 1]
    figure, (saving_axis, cost_axis) = plt.subplots(1, 2, figsize=(12, 4.2))
    modes = [m for m in (IDLE, CONCURRENT) if profile.verify.get(m)]
    bar = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        base = profile.mean_over_offsets(1, mode)[0]
        savings = [100 * profile.saving(k, mode) for k in widths]
        errors = [100 * profile.mean_over_offsets(k, mode)[1] / (k * base) for k in widths]
        saving_axis.bar(
            [k + (i - 0.5 * (len(modes) - 1)) * bar for k in widths], savings, bar, yerr=errors, label=mode, capsize=2
        )
        all_widths = profile.widths
        cost_axis.plot(all_widths, [1000 * profile.mean_over_offsets(k, mode)[0] for k in all_widths], "o-", label=mode)
    if transformers_ms:
        cost_axis.plot(
            list(transformers_ms), list(transformers_ms.values()), "s--", label="transformers forward (idle)"
        )
    saving_axis.set(
        xlabel="physical width K",
        ylabel="R(K) = 1 - V(K) / (K V(1))  [%]",
        title=f"Per-position verification saving, {profile.target} {profile.dtype}",
    )
    cost_axis.set(xlabel="physical width K", ylabel="call time V(K) [ms]", title="Verification call time")
    for axis in (saving_axis, cost_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    save(figure, path, dpi=120)
