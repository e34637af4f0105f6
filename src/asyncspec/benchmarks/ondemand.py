"""`asyncspec bench ondemand` (seed 000 §5.4, App. D.6.1): requests over a long recording.

The recording is fed block by block; at every position (each `--every` seconds) the latest window
is prepared in the background, then one request per method asks for that window, all answered by
the same service from the same prepared state. Latency runs from the request's arrival to its
complete response (residual preparation, the producer's start and drain included). Every method is
checked token for token against target-only on the same window.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import median
from typing import Any

HELP = "requests every 30 s over a long recording: target vs sd vs specasr vs as2d latency"
METHOD_ORDER = ["target", "sd", "specasr", "as2d"]
RECORDINGS = {"espeak": "ondemand_espeak.wav", "librivox": "ondemand_librivox.wav"}


def add_arguments(parser) -> None:
    from asyncspec.run.options import add_decoding_options

    parser.add_argument("--audio", metavar="FILE", help="a long recording (default: built, see --recording)")
    parser.add_argument(
        "--recording",
        choices=["espeak", "librivox"],
        default="espeak",
        help="without --audio: >= 10 min of public-domain prose by espeak-ng, or the LibriVox clips joined",
    )
    parser.add_argument("--every", type=float, default=30.0, help="seconds between request positions")
    parser.add_argument("--until", type=float, default=600.0, help="last position (seconds into the recording)")
    parser.add_argument("--window-s", type=float, default=30.0, help="latest audio each request transcribes")
    parser.add_argument("--block-s", type=float, default=2.0, help="ingestion block (positions fall on block ends)")
    parser.add_argument("--out", default="out", help="folder for bench_ondemand.json / .png and the recording")
    parser.add_argument("--json", metavar="FILE", help="also write the JSON report here")
    add_decoding_options(parser, "whisper-base", "whisper-tiny.en")
    parser.set_defaults(method="sd,specasr,as2d")


def run(args) -> int:
    from asyncspec.audio import load_audio
    from asyncspec.data.longform import librivox_recording, long_recording
    from asyncspec.errors import InputError
    from asyncspec.models.hf_whisper import WhisperBackend
    from asyncspec.run.compare import equality_check
    from asyncspec.run.models import load_models
    from asyncspec.run.options import DecodingOptions, decode_config
    from asyncspec.run.report import progress, write_json

    if not args.every > 0:
        raise InputError(f"--every must be positive, got {args.every}")
    options = DecodingOptions.from_args(args)
    methods = [m for m in METHOD_ORDER if m in options.methods or m == "target"]
    options = options.running(methods)
    out = Path(args.out)
    build = {"espeak": long_recording, "librivox": librivox_recording}[args.recording]
    path = Path(args.audio) if args.audio else build(out / RECORDINGS[args.recording])
    samples = load_audio(path)
    config = decode_config(options)
    load_before = os.getloadavg()
    with load_models(options, WhisperBackend, "speech") as (target, drafters):
        exactness = equality_check(target, config, compare=True)
        sweep = RequestSweep(target, drafters, samples, args.window_s, args.block_s, exactness)
        positions = sweep.positions(args.every, args.until)
        if not positions:
            raise InputError(f"{path}: shorter than the first position ({args.every:g} s)")
        sweep.warm_up(positions[0], methods, config)
        records = [
            r for p in progress(positions, len(positions), "bench ondemand") for r in sweep.at(p, methods, config)
        ]
        memory = sweep.memory()
        sweep.close()
    report = build_report(records, options, args, str(path), load_before, memory)
    report["exactness"] = exactness.as_json() if exactness else None
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_ondemand.json").write_text(json.dumps(report, indent=1))  # saved before anything can fail
    if args.json:
        write_json(args.json, report)
    print_report(report)
    plot_positions(records, methods, out / "bench_ondemand.png")
    print(f"wrote {out / 'bench_ondemand.json'} and bench_ondemand.png")
    return exactness.report() if exactness else 0


class RequestSweep:
    """The service (window, background preparer, engine) fed by the benchmark, block by block."""

    def __init__(self, target, drafters, samples, window_s: float, block_s: float, exactness=None):
        from asyncspec.ondemand.engine import Engine
        from asyncspec.ondemand.ingest import LatestWindow, file_blocks
        from asyncspec.ondemand.prepared_state import Preparer

        self.samples, self.window = samples, LatestWindow(window_s)
        self.preparer = Preparer(target, self.window).start()
        self.engine = Engine(target, drafters, self.window, self.preparer, max_queue=1).start()
        self.blocks = file_blocks(samples, block_s, "fast")
        self.target, self.drafters = target, drafters
        self.exactness = exactness  # every response checked against target-only's on the same window

    def positions(self, every: float, until: float) -> list[float]:
        duration = len(self.samples) / 16_000
        count = int(min(until, duration) // every)
        return [every * (i + 1) for i in range(count)]

    def _feed_until(self, position: float) -> None:
        while self.window.end_s < position - 1e-6:
            block = next(self.blocks, None)
            if block is None:
                return
            self.window.append(block)
            self.preparer.on_block(block)

    def _request(self, method: str, config):
        return self._answered(method, config)[1]

    def _answered(self, method: str, config):
        """(the job, its response): the job keeps the audio view the response was decoded from."""
        job = self.engine.submit_live(None, method, config)
        return job, job.future.result()

    def warm_up(self, position: float, methods: list[str], config) -> None:
        """One unrecorded request per method (first calls allocate and load lazily)."""
        self._feed_until(position)
        self.preparer.wait_for(self.window.blocks, 120.0)
        for method in methods:
            self._request(method, config)

    def at(self, position: float, methods: list[str], config) -> list[dict[str, Any]]:
        self._feed_until(position)
        prepared = self.preparer.wait_for(self.window.blocks, 120.0)
        answered = [self._answered(method, config) for method in methods]
        responses = [response for _, response in answered]
        reference = responses[0].tokens  # target-only runs first
        equal = [True] + [self._check(job, response, reference) for job, response in answered[1:]]
        return [
            {
                "position_s": round(self.window.end_s, 2),
                "prepare_s": round(prepared.prepare_s, 4) if prepared else None,
                **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.as_dict().items()},
                "equal_to_target": same if self.exactness is not None else None,
                "token_ids": r.tokens,
            }
            for r, same in zip(responses, equal, strict=True)
        ]

    def _check(self, job, response, reference: list[int]) -> bool:
        if self.exactness is None:
            return response.tokens == reference
        from asyncspec.ondemand.prepared_state import WHISPER_SAMPLE_LEN

        request = self.target.request(job.audio, language=job.language, max_new_tokens=WHISPER_SAMPLE_LEN)
        where = f"the request at {job.live_end_s:.2f} s"
        return self.exactness.check(where, response.method, request, reference, response.tokens)

    def memory(self) -> dict:
        from asyncspec.ondemand.memory import memory_report

        producer = self.drafters.get("as2d")
        return memory_report(
            self.target,
            self.drafters,
            self.window,
            self.preparer,
            getattr(getattr(producer, "process", None), "pid", None),
        )

    def close(self) -> None:
        self.engine.close()
        self.preparer.close()


def method_figures(records: list[dict], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method, over the requests whose output equals target-only's: a mismatched response is
    never part of a latency or speed figure (`mismatched_requests` counts them)."""
    figures = {}
    target_rows = {r["position_s"]: r for r in records if r["method"] == "target"}
    target_latency = median(r["latency_s"] for r in target_rows.values())
    for method in methods:
        every = [r for r in records if r["method"] == method]
        rows = [r for r in every if r["equal_to_target"] is not False]
        latency = median(r["latency_s"] for r in rows) if rows else float("nan")
        figures[method] = {
            "requests": len(every),
            "mismatched_requests": len(every) - len(rows),
            "equal_requests": sum(bool(r["equal_to_target"]) for r in every),
            "median_latency_s": round(latency, 4),
            "latency_ratio_to_target": round(latency / target_latency, 4) if target_latency else None,
            "median_tps": round(median(r["tps"] for r in rows), 3) if rows else float("nan"),
            "median_residual_prepare_s": round(median(r["residual_prepare_s"] for r in rows), 4) if rows else None,
            "prepared_requests": sum(bool(r["prepared"]) for r in rows),
            "tokens": sum(r["n_tokens"] for r in rows),
            "faster_than_target_positions": sum(
                r["latency_s"] < target_rows[r["position_s"]]["latency_s"] for r in rows
            ),
        }
    return figures


def build_report(records, options, args, recording: str, load_before, memory) -> dict[str, Any]:
    return {
        "recording": recording,
        "model": options.model,
        "drafter": options.drafter,
        "producer": options.producer,
        "producer_model": options.producer_model,
        "dtype": options.dtype,
        "budget": options.budget,
        "as2d": options.as2d_record(),
        "window_s": args.window_s,
        "every_s": args.every,
        "cores": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "memory": memory,
        "methods": method_figures(records, list(options.methods)),
        "records": records,
    }


def print_report(report: dict[str, Any]) -> None:
    header = f"{'method':8s} {'requests':>8s} {'equal':>5s} {'median latency':>14s} {'x target':>8s} "
    header += f"{'median TPS':>10s} {'faster':>6s}"
    print(header)
    print("-" * len(header))
    for method, f in report["methods"].items():
        print(
            f"{method:8s} {f['requests']:8d} {f['equal_requests']:5d} {f['median_latency_s']:12.3f} s "
            f"{f['latency_ratio_to_target'] or 0:8.3f} {f['median_tps']:10.2f} {f['faster_than_target_positions']:6d}"
        )
    for method, f in report["methods"].items():
        if f["mismatched_requests"]:
            print(f"{method}: {f['mismatched_requests']} request(s) differing from target-only left out of its figures")
    load = report["load_average_before"][0], report["load_average_after"][0]
    print(f"machine: {report['cores']} cores, load average {load[0]:.2f} -> {load[1]:.2f}; memory {report['memory']}")


def plot_positions(records: list[dict], methods: list[str], path: Path) -> None:
    from asyncspec.plots import plt, save

    figure, (tps_axis, latency_axis) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for method in methods:
        rows = [r for r in records if r["method"] == method]
        x = [r["position_s"] for r in rows]
        tps_axis.plot(
            x,
            [r["tps"] if r["equal_to_target"] is not False else float("nan") for r in rows],
            "o-",
            label=method,
            markersize=3,
        )
        latency_axis.plot(x, [r["latency_s"] for r in rows], "o-", label=method, markersize=3)
    tps_axis.set_ylabel("request-to-completion tokens/s")
    tps_axis.set_title("on-demand requests for the latest window (prepared in the background)")
    tps_axis.legend(fontsize=8)
    latency_axis.set_ylabel("latency (s)")
    latency_axis.set_xlabel("request position in the recording (s)")
    save(figure, path)
