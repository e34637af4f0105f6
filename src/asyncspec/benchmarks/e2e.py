"""`asyncspec bench e2e`: wall time from audio file to text, per file and in total, for asyncspec
target-only and As²d and for faster-whisper int8 and float32 on the same Whisper weights, in one run,
the same cores, greedy, no VAD, the same 30 s windows; and whisper.cpp on those weights as its CLI
runs by default (beam 5, its own long-form segments). Model loads are timed apart; WER against the
transcripts where they exist; every As²d output is checked against target-only's tokens."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from asyncspec.audio import SAMPLE_RATE
from asyncspec.benchmarks.e2e_files import FILE_SETS, BenchFile, bench_files
from asyncspec.benchmarks.e2e_report import cpu_flags, isa_environment, plot, ratio_table
from asyncspec.benchmarks.e2e_systems import (
    ASYNCSPEC_VARIANTS,
    FASTER_WHISPER_HINT,
    faster_whisper_installed,
)
from asyncspec.benchmarks.e2e_whispercpp import PYWHISPERCPP_HINT
from asyncspec.benchmarks.e2e_whispercpp import available as whispercpp_installed
from asyncspec.errors import InputError
from asyncspec.models.threads import available_cores
from asyncspec.text_metrics import word_errors, word_recall

HELP = "audio file to text: asyncspec target-only and As²d vs faster-whisper int8/float32 and whisper.cpp, same weights"
ASYNCSPEC_SYSTEMS = tuple(ASYNCSPEC_VARIANTS)
# name -> (compute type, preset of e2e_systems.FASTER_WHISPER_PRESETS). The unsuffixed names are the
# stripped settings the short-file figures were measured with; -greedy is faster-whisper's long-form
# algorithm greedy (timestamps, conditioning, fallback), -default its transcribe defaults (beam 5).
FASTER_WHISPER = {
    f"faster-whisper-{compute}{suffix}": (compute, preset)
    for compute in ("int8", "float32")
    for suffix, preset in (("", "stripped"), ("-greedy", "greedy"), ("-default", "default"), ("-batched", "batched"))
}
# whisper.cpp runs as its CLI does (beam 5, its own long-form segments): see e2e_whispercpp.
WHISPER_CPP = "whisper-cpp"
SYSTEMS = ASYNCSPEC_SYSTEMS + tuple(FASTER_WHISPER) + (WHISPER_CPP,)
DEFAULT_SYSTEMS = (
    "target",
    "as2d",
    "beam5",
    "batched",
    "faster-whisper-int8-greedy",
    "faster-whisper-int8-default",
    "faster-whisper-int8-batched",
    WHISPER_CPP,
)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--audio",
        metavar="DIR",
        help="audio files (a <name>.txt beside one is its transcript; default: --set)",
    )
    parser.add_argument("--out", default="out", help="folder for bench_e2e.json, bench_e2e.png (and joined audio)")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma list of: {', '.join(SYSTEMS)}")
    parser.add_argument(
        "--threads",
        type=int,
        default=available_cores(),
        help="cores every system may use (all); asyncspec's decoder takes fewer where it measures them faster",
    )
    parser.add_argument(
        "--order",
        default="interleaved",
        choices=["interleaved", "streams"],
        help="interleaved: file by file, systems in rotating order (fair under load); streams: system by system",
    )
    parser.add_argument(
        "--set",
        default="longform",
        choices=FILE_SETS,
        help="built-in files: long-form recordings (three; longform-large: eight), or short clips",
    )
    parser.add_argument(
        "--cold",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="also time each system in a fresh process over all files (load and imports included)",
    )
    parser.add_argument("--model", default="whisper-base", help="the Whisper weights every system runs")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["bf16", "fp32", "int8", "auto"],
        help="asyncspec target dtype (auto, as transcribe: int8, bf16 or fp32, the fastest here, measured)",
    )
    parser.add_argument(
        "--encoder", default="auto", choices=["auto", "fp32", "bf16", "int8"], help="asyncspec encoder (auto: measured)"
    )
    parser.add_argument("--producer-model", default="whisper-tiny.en", help="as2d: the producer's recogniser")
    parser.add_argument("--chunk-s", type=float, default=None, help="as2d: seconds per chunk (default: deployed)")
    parser.add_argument("--budget", type=int, default=None, help="as2d: proposals per round (default: deployed)")


def run(args) -> int:
    names = parse_systems(args.systems)
    if args.threads < 1 or (args.budget is not None and args.budget < 1):
        raise InputError(f"--threads and --budget must be at least 1, got {args.threads} and {args.budget}")
    out = Path(args.out)
    as2d = as2d_configuration(args, names)
    files = bench_files(args.audio, args.set, out)
    # Before any model loads: the producer process's start sets OMP_NUM_THREADS for itself.
    before = {"isa_environment": isa_environment(), "load_average_before": os.getloadavg()}
    with ExitStack() as stack:
        systems = load_systems(args, names, stack)
        results = measure(systems, files, interleaved=args.order == "interleaved")
        check = exactness_check(systems, results, files)
        report = build_report(args, files, systems, results, check, before) | {"as2d": as2d}
    differing: list[str] = []
    failed: list[str] = []
    if args.cold:  # after every warm model is closed: the fresh processes have the machine to themselves
        from asyncspec.benchmarks.e2e_cold import cold_walls, failed_cold_runs, warm_cold_differences

        paths = [f.path for f in files]
        for name, cold in cold_walls(names, paths, args.model, args.threads, _cold_options(args)).items():
            report["systems"][name]["cold"] = cold
        differing = report["warm_cold_differences"] = warm_cold_differences(report["systems"])
        failed = report["cold_failures"] = failed_cold_runs(report["systems"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_e2e.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "bench_e2e.png")

    print(ratio_table(report))
    print(f"wrote {out / 'bench_e2e.json'}, {out / 'bench_e2e.png'}")
    code = check.report() if check is not None else 0
    if differing:  # the same seeded method gave another text in a fresh process: the target is not one
        from asyncspec.exactness import EXIT_MISMATCH

        print(f"warm and cold texts differ: {', '.join(differing)}", file=sys.stderr)
        return EXIT_MISMATCH
    if failed:  # no cold time to compare: said, and the bench fails
        print("cold runs failed:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return code


def as2d_configuration(args, names: list[str]) -> dict | None:
    """The configuration the Transcriber's As²d runs with (long-form: the ct2-chunk producer), for
    the report, announced on stderr as every command announces a deployed one."""
    if "as2d" not in names:
        return None
    from asyncspec.decoding.as2d import DEFAULT_BUDGET
    from asyncspec.profiling.deployed import deployed_as2d
    from asyncspec.transcription.loading import LONGFORM_PRODUCER

    as2d = deployed_as2d(None, args.chunk_s, args.budget, required=LONGFORM_PRODUCER)
    if note := as2d.note():
        print(note, file=sys.stderr)
    return as2d.record(DEFAULT_BUDGET)


def _cold_options(args) -> list[str]:
    """`asyncspec transcribe` options that make the cold run the same configuration as the warm one."""
    options = ["--model", args.model, "--dtype", args.dtype, "--encoder", args.encoder]
    options += ["--producer-model", args.producer_model]
    if (solo := solo_threads(args.threads)) is not None:
        options += ["--solo-threads", str(solo)]
    for flag, value in (("--chunk-s", args.chunk_s), ("--budget", args.budget)):
        options += [flag, str(value)] if value is not None else []
    return options


def solo_threads(threads: int) -> int | None:
    """The decoder's thread count alone, as the Transcriber takes it: None (every core where it
    measures them faster, as `asyncspec transcribe` runs by default) when the bench gives every
    core; else the bench's narrower count. Forced, a count the decoder measures slower is imposed:
    under OMP_WAIT_POLICY=PASSIVE a two-thread call took 26.7 ms against 14.7 on one (whisper-base
    int8, 2-core Zen 4 capped to VNNI), and the bench would time a configuration no user runs."""
    return None if threads >= available_cores() else threads


def parse_systems(text: str) -> list[str]:
    """The systems in the order given; As²d brings target-only, the reference it must equal."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SYSTEMS]
    if unknown or not names:
        raise InputError(f"unknown system {', '.join(unknown) or repr(text)}; choose from {', '.join(SYSTEMS)}")
    if "as2d" in names and "target" not in names:
        names.insert(0, "target")
    if not faster_whisper_installed() and any(name in FASTER_WHISPER for name in names):
        print(f"note: faster-whisper is not installed, its systems are skipped: {FASTER_WHISPER_HINT}", file=sys.stderr)
        names = [name for name in names if name not in FASTER_WHISPER]
    if not whispercpp_installed() and WHISPER_CPP in names:
        print(f"note: pywhispercpp is not installed, whisper-cpp is skipped: {PYWHISPERCPP_HINT}", file=sys.stderr)
        names.remove(WHISPER_CPP)
    return list(dict.fromkeys(names))


def load_systems(args, names: list[str], stack: ExitStack) -> dict:
    """Every system loaded, each in its own worker process (e2e_isolated.py), before any file is
    timed; each one's load time kept apart. Target-only and As²d share one worker and its target
    (As²d's load adds its producer process's start)."""
    from asyncspec.benchmarks.e2e_isolated import IsolatedSystem, SystemWorker

    workers: list[tuple[SystemWorker, list[str]]] = []
    asyncspec = [name for name in names if name in ASYNCSPEC_SYSTEMS]
    if asyncspec:
        hosted = list(dict.fromkeys(["target", *asyncspec]))  # target-only: the reference As²d must equal
        options = {"dtype": args.dtype, "encoder": args.encoder, "producer_model": args.producer_model}
        options |= {"chunk_s": args.chunk_s, "budget": args.budget, "solo_threads": solo_threads(args.threads)}
        worker = SystemWorker("asyncspec", {"model": args.model, "systems": hosted, "options": options})
        stack.callback(worker.close)
        print(f"asyncspec target: {worker.ready.extras['describe']}", flush=True)
        workers.append((worker, hosted))
    for name in names:
        if name in FASTER_WHISPER:
            compute_type, preset = FASTER_WHISPER[name]
            arguments = {"name": name, "model": args.model, "compute_type": compute_type, "threads": args.threads}
            workers.append((SystemWorker("faster-whisper", arguments | {"preset": preset}), [name]))
        elif name == WHISPER_CPP:
            arguments = {"name": name, "model": args.model, "threads": args.threads}
            workers.append((SystemWorker("whisper-cpp", arguments), [name]))
        else:
            continue
        stack.callback(workers[-1][0].close)
    systems = {name: IsolatedSystem(worker, name) for worker, hosted in workers for name in hosted}
    return {name: systems[name] for name in names}


def measure(systems: dict, files: list[BenchFile], interleaved: bool = True) -> dict[str, list]:
    """(seconds, transcript) per system per file. Each system first transcribes the first 10 s of the
    first file untimed: first-call allocations are start-up, like the load, and reported apart with it.

    Interleaved (the default): file by file, every system in turn, the order rotating per file, so
    a shared machine's drifting load falls on all systems alike. Streams: each system transcribes
    all files as one stream, one system after another; a file's seconds run from the previous
    file's text to its own, so a path that overlaps files would get the credit (a quiet machine)."""
    with tempfile.TemporaryDirectory(prefix="asyncspec-warmup-") as scratch:  # never beside the user's files
        warmup = _warmup_excerpt(files[0].path, Path(scratch))
        for name, system in systems.items():
            system.warmup_s, _ = system.timed(warmup)
            print(f"{name}: loaded in {system.load_s:.2f} s, warm-up {system.warmup_s:.2f} s", flush=True)
    if not interleaved:
        return {name: _timed_stream(name, system, files) for name, system in systems.items()}
    results: dict[str, list] = {name: [] for name in systems}
    names = list(systems)
    for index, bench_file in enumerate(files):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            results[name].append(systems[name].timed(bench_file.path))
            seconds, transcript = results[name][-1]
            print(f"{bench_file.path.name} {name}: {seconds:.2f} s  {transcript.text}", flush=True)
    return {name: results[name] for name in systems}


def _warmup_excerpt(path: Path, folder: Path, seconds: float = 10.0) -> Path:
    """The first seconds of the first file, written into `folder`, for every system's untimed first call."""
    import soundfile

    from asyncspec.audio import load_audio

    excerpt = folder / f"warmup-{path.stem}.wav"
    soundfile.write(str(excerpt), load_audio(path)[: int(seconds * SAMPLE_RATE)], SAMPLE_RATE, subtype="PCM_16")
    return excerpt


def _timed_stream(name: str, system, files: list[BenchFile]) -> list:
    measured = system.timed_stream([f.path for f in files])
    for bench_file, (seconds, transcript) in zip(files, measured, strict=True):
        print(f"{bench_file.path.name} {name}: {seconds:.2f} s  {transcript.text}", flush=True)
    return measured


class WindowCheck:
    """The exactness check's outcome, made in the asyncspec worker (which holds the target)."""

    def __init__(self, as_json: dict, code: int, text: str):
        self._json, self.code, self.text = as_json, code, text

    def as_json(self) -> dict:
        return self._json

    def report(self) -> int:
        print(self.text, end="")
        return self.code


def exactness_check(systems: dict, results: dict[str, list], files: list[BenchFile]) -> WindowCheck | None:
    """Every As²d window (seek, prompt, tokens) against target-only's (None without As²d)."""
    if "as2d" not in results:
        return None
    expected = [transcript.info for _, transcript in results["target"]]
    got = [transcript.info for _, transcript in results["as2d"]]
    paths = [str(f.path) for f in files]
    return WindowCheck(*systems["target"].worker.call("check", paths, expected, got))


def build_report(args, files, systems, results, check, before: dict) -> dict:
    from asyncspec.profiling.measure import device_facts

    device = device_facts() | {"cpu_flags": cpu_flags()} | before
    return {
        "device": device | {"load_average_after": os.getloadavg()},
        "model": args.model,
        "dtype": args.dtype,
        "encoder": _encoder_placement(systems),
        "threads": args.threads,
        "order": args.order,
        "files": [{"file": str(f.path), "audio_s": round(f.audio_s, 3), "transcript": f.transcript} for f in files],
        "systems": {name: system_summary(systems[name], results[name], files) for name in results},
        "exactness": check.as_json() if check is not None else None,
    }


def _encoder_placement(systems: dict) -> dict | None:
    """The asyncspec target's encoder dtype and threads (and the timings that chose them)."""
    target = systems.get("target")
    return target.extras["encoder"] if target is not None else None


def system_summary(system, measured: list, files: list[BenchFile]) -> dict:
    records = [_file_record(f, seconds, transcript) for f, (seconds, transcript) in zip(files, measured, strict=True)]
    scored = [r for r in records if "words" in r]
    words = sum(r["words"] for r in scored)
    summary = {
        "total_s": round(sum(seconds for seconds, _ in measured), 4),
        "load_s": round(system.load_s, 4),
        "warmup_s": round(system.warmup_s, 4),
        "wer": round(sum(r["errors"] for r in scored) / words, 4) if words else None,
        "recall_min": min((r["recall"] for r in scored), default=None),
        "files": records,
        "settings": system.settings(),
    }
    if any(transcript.info is not None for _, transcript in measured):  # asyncspec's stage split
        summary["prefill_s"] = round(sum(t.prefill_s for _, t in measured), 4)
        summary["decode_s"] = round(sum(t.decode_s for _, t in measured), 4)
    return summary


def _file_record(bench_file: BenchFile, seconds: float, transcript) -> dict:
    record = {"file": bench_file.path.name, "audio_s": round(bench_file.audio_s, 3), "wall_s": round(seconds, 4)}
    record["text"] = transcript.text
    if transcript.segments:
        record["segments"] = [[round(start, 2), round(end, 2), text] for start, end, text in transcript.segments]
    if transcript.info is not None:
        record["token_ids"] = [w.chosen.result.tokens for w in transcript.info.windows]
        record["fallbacks"], record["skipped"] = transcript.info.stats.fallbacks, transcript.info.stats.skipped
    if bench_file.transcript is not None:
        record["errors"], record["words"] = word_errors(bench_file.transcript, transcript.text)
        record["recall"] = round(word_recall(bench_file.transcript, transcript.text), 4)
    return record
