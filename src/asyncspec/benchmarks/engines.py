"""`asyncspec bench engines`: the fixed-shape target engine beside transformers' own forward, per
dtype, in one run: the invariance self-test's verdict, the call time V(K) of every width, and
target-only (both engines) and As²d (where the self-test passes) throughput on real speech."""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import median
from typing import cast

from asyncspec.errors import InputError

HELP = "fixed-shape engine vs transformers forward: self-test, V(K), target-only and As²d throughput"
ENGINES = ("transformers", "fixed-shape")
OFFSETS = (0, 32)


def add_arguments(parser) -> None:
    parser.add_argument("--model", default="whisper-base")
    parser.add_argument("--dtypes", default="bf16,fp32,int8", help="comma list of bf16, fp32, int8")
    parser.add_argument("--max-width", type=int, default=16, help="V(K) for K = 1..this")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--windows", type=int, default=5, help="LibriVox windows for the throughput runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="out", help="folder for engines.json and engines.png")


def run(args) -> int:
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or any(d not in ("bf16", "fp32", "int8") for d in dtypes) or args.max_width < 1 or args.windows < 1:
        raise InputError("--dtypes takes bf16, fp32 and/or int8; --max-width and --windows must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    windows = _windows(args.windows)
    results = {dtype: {engine: _measure(args, dtype, engine, windows) for engine in ENGINES} for dtype in dtypes}
    exact = all(r["as2d"].get("exactness", {"passed": True})["passed"] for e in results.values() for r in e.values())
    from asyncspec.profiling.measure import device_facts

    report = {"device": device_facts(), "model": args.model, "threads": args.threads, "results": results}
    (out / "engines.json").write_text(json.dumps(report, indent=1))
    _print(results)
    _plot(results, out / "engines.png")
    print(f"wrote {out / 'engines.json'}, {out / 'engines.png'}")
    from asyncspec.exactness import EXIT_MISMATCH

    return 0 if exact else EXIT_MISMATCH


def _windows(n: int):
    from asyncspec.data.windows import librivox_windows

    return [samples for _, _, samples in librivox_windows()[:n]]


def _measure(args, dtype: str, engine: str, windows) -> dict:
    from asyncspec.models.hf_whisper import WhisperBackend
    from asyncspec.models.registry import load_decoder
    from asyncspec.models.selftest import invariance

    target = cast(WhisperBackend, load_decoder(args.model, dtype, engine=engine))  # --model: a speech model
    report = invariance(target, use_cache=False)
    print(f"{engine} {dtype}: {report.summary()}", flush=True)
    requests = [target.request(w) for w in windows]
    widths = range(1, args.max_width + 1)
    call_ms = {k: 1000 * _call_time(target, requests[0], k, args.repetitions) for k in widths}
    reference = _throughput(target, None, requests)
    result = {"self_test": report.__dict__, "v_ms": call_ms, "target": _figures(reference)}
    if not report.passed:
        result["as2d"] = {"refused": report.first_difference}
        return result
    as2d = _as2d(target, requests)
    from asyncspec.exactness import ExactnessCheck

    check = ExactnessCheck(target)
    for request, expected, got in zip(requests, reference["runs"], as2d["runs"], strict=True):
        check.check(
            f"{engine} {dtype} window of {len(request.audio) / 16000:.1f} s",
            "as2d",
            request,
            expected.tokens,
            got.tokens,
        )
    check.report()
    result["as2d"] = _figures(as2d) | {"exactness": check.as_json()}
    return result


def _figures(measured: dict) -> dict:
    return {key: value for key, value in measured.items() if key != "runs"}


def _call_time(target, request, width: int, repetitions: int) -> float:
    """Median seconds of one extend of `width` tokens, over OFFSETS and repetitions (one warm-up)."""
    times = []
    for offset in OFFSETS:
        state = target.prefill(request)
        tokens = [220 + (i % 50) for i in range(offset + width)]
        if offset:
            target.extend(state, tokens[:offset])
        base = state.length
        for repetition in range(repetitions + 1):
            start = time.perf_counter()
            target.extend(state, tokens[offset:])
            if repetition:
                times.append(time.perf_counter() - start)
            target.rollback(state, base)
    return median(times)


def _throughput(target, drafter, requests, method: str = "target") -> dict:
    """Decode throughput (the encoder runs inside each prefill, as in `bench ondevice`, so As²d's
    producer starts beside it)."""
    from asyncspec.decoding.methods import METHODS
    from asyncspec.decoding.result import DecodeConfig

    runs = [METHODS[method](target, drafter, request, DecodeConfig()) for request in requests]
    tokens = sum(len(r.tokens) for r in runs)
    seconds = sum(r.stats.decode_s for r in runs)
    return {"tokens": tokens, "decode_s": round(seconds, 4), "tok_s": round(tokens / seconds, 2), "runs": runs}


def _as2d(target, requests) -> dict:
    from asyncspec.models.offline import ct2_model_dir
    from asyncspec.ondevice.producer import ProducerProcess, ProducerSpec

    spec = ProducerSpec(
        model_dir=str(ct2_model_dir("whisper-tiny.en")), target_tokenizer_json=target.tokenizer.backend.to_str()
    )
    producer = ProducerProcess(spec)
    try:
        return _throughput(target, producer, requests, method="as2d")
    finally:
        producer.close()


def _print(results: dict) -> None:
    for dtype, by_engine in results.items():
        print(f"\n{dtype}: V(K) ms (median)")
        widths = list(next(iter(by_engine.values()))["v_ms"])
        shown = [k for k in widths if k in (1, 2, 4, 7, 8, 9, 12, 16)]
        print(f"{'engine':<14}" + "".join(f"{'K=' + str(k):>8}" for k in shown) + f"{'self-test':>11}")
        for engine, r in by_engine.items():
            verdict = "pass" if r["self_test"]["passed"] else "FAIL"
            print(f"{engine:<14}" + "".join(f"{r['v_ms'][k]:>8.1f}" for k in shown) + f"{verdict:>11}")
        print(f"{'engine':<14}{'target tok/s':>14}{'as2d tok/s':>12}{'x target':>10}{'as2d exact':>12}")
        for engine, r in by_engine.items():
            as2d, target_tps = r["as2d"], r["target"]["tok_s"]
            if "refused" in as2d:
                print(f"{engine:<14}{target_tps:>14.1f}{'refused: self-test failed':>34}")
                continue
            exactness = as2d["exactness"]
            verdict = f"{exactness['checked'] - len(exactness['mismatches'])}/{exactness['checked']}"
            print(
                f"{engine:<14}{target_tps:>14.1f}{as2d['tok_s']:>12.1f}{as2d['tok_s'] / target_tps:>10.2f}{verdict:>12}"
            )


def _plot(results: dict, path: Path) -> None:
    from asyncspec.plots import plt, save

    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for axis, (dtype, by_engine) in zip(axes[0], results.items(), strict=True):
        for engine, r in by_engine.items():
            widths = [int(k) for k in r["v_ms"]]
            axis.plot(widths, list(r["v_ms"].values()), "o-", label=engine)
        axis.set(xlabel="call width K", ylabel="V(K) [ms]", title=f"Verification call time, {dtype}")
        axis.grid(alpha=0.3)
        axis.legend()
    save(figure, path, dpi=120)
