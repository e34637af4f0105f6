"""Cold process wall: one system over a list of files in a fresh `python` process, timed from
spawn to exit, model loading and every import included, as a command-line user pays it (the
warm figures of `bench e2e` load every model before the clock starts).

faster-whisper runs as a user's own script would: a `python -c` entry that imports only
faster_whisper, loads WhisperModel from the CTranslate2 directory (converted beforehand, as a
user's model already on disk is) and transcribes the files under a preset of e2e_systems. It
imports nothing of asyncspec, so asyncspec's imports never count against it. asyncspec runs its
own command line, `asyncspec transcribe --output-format json --output-dir DIR FILE...`; that
command is a parameter (ASYNCSPEC_COMMAND, with placeholders), so it can follow the CLI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asyncspec.benchmarks.e2e_systems import (
    ASYNCSPEC_VARIANTS,
    BATCHED_PRESETS,
    FASTER_WHISPER_PRESETS,
    PRESET_NAMES,
    Segment,
    ct2_directory,
)

# The faster-whisper entry: argv[1] is a JSON spec (model_dir, compute_type, threads, batched,
# transcribe, files, output); it writes [{"file", "text", "segments": [[start, end, text], ...]}] to output.
FASTER_WHISPER_ENTRY = """
import json, sys
from faster_whisper import BatchedInferencePipeline, WhisperModel
spec = json.loads(sys.argv[1])
model = WhisperModel(spec["model_dir"], device="cpu", compute_type=spec["compute_type"], cpu_threads=spec["threads"])
pipeline = BatchedInferencePipeline(model) if spec["batched"] else model
results = []
for path in spec["files"]:
    segments, _ = pipeline.transcribe(path, **spec["transcribe"])
    found = [[s.start, s.end, s.text.strip()] for s in segments]
    results.append({"file": path, "text": " ".join(t for _, _, t in found).strip(), "segments": found})
with open(spec["output"], "w") as out:
    json.dump(results, out)
"""
# {asyncspec}: the installed console script; {method}: the decoding method; {output_dir}: where
# it writes <stem>.json per file; {files}: the files, one argument each.
ASYNCSPEC_COMMAND = (
    "{asyncspec}",
    "transcribe",
    "--language",
    "en",  # as every system of the bench: English audio, no detection pass
    "--method",
    "{method}",
    "--output-format",
    "json",
    "--output-dir",
    "{output_dir}",
    "{files}",
)
STDERR_TAIL = 2000


@dataclass
class ColdRun:
    """One fresh process over the files: its wall (spawn to exit), exit code and outputs in file
    order ("" and no segments for a file it did not transcribe)."""

    system: str
    command: list[str]
    wall_s: float
    returncode: int
    texts: list[str]
    segments: list[list[Segment]] = field(default_factory=list)
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and all(self.texts)

    def record(self) -> dict:
        """For a benchmark's JSON."""
        return {"wall_s": round(self.wall_s, 4), "returncode": self.returncode, "texts": self.texts} | (
            {"stderr_tail": self.stderr_tail} if self.returncode else {}
        )


Reader = Callable[[Path, list[Path]], tuple[list[str], list[list[Segment]]]]


def timed_process(
    system: str, command: list[str], files: list[Path], work: Path, read: Reader, timeout_s: float | None = None
) -> ColdRun:
    """Run `command`, wall from spawn to exit, then read its outputs from `work`. A process that
    outlives `timeout_s` is killed and recorded with exit code -9 and no texts."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    wall = time.perf_counter() - started
    texts, segments = read(work, files) if process.returncode == 0 else ([""] * len(files), [[] for _ in files])
    return ColdRun(system, command, wall, process.returncode, texts, segments, (stderr or "")[-STDERR_TAIL:])


def cold_faster_whisper(
    files: Sequence[Path],
    model: str = "whisper-base",
    compute_type: str = "int8",
    preset: str = "longform-greedy",
    threads: int = 1,
    timeout_s: float | None = None,
) -> ColdRun:
    """faster-whisper in a fresh process under `preset` (a FASTER_WHISPER_PRESETS key or alias)."""
    preset = PRESET_NAMES.get(preset, preset)
    files = [Path(f) for f in files]
    with tempfile.TemporaryDirectory(prefix="asyncspec-cold-") as scratch:
        work = Path(scratch)
        spec = {"model_dir": str(ct2_directory(model)), "compute_type": compute_type, "threads": threads}
        spec |= {"transcribe": FASTER_WHISPER_PRESETS[preset], "batched": preset in BATCHED_PRESETS}
        spec["files"] = [str(f) for f in files]
        spec["output"] = str(work / "results.json")
        command = [sys.executable, "-c", FASTER_WHISPER_ENTRY, json.dumps(spec)]
        name = f"faster-whisper-{compute_type}-{preset}"
        return timed_process(name, command, files, work, _read_faster_whisper, timeout_s)


def _read_faster_whisper(work: Path, files: list[Path]) -> tuple[list[str], list[list[Segment]]]:
    results = json.loads((work / "results.json").read_text())
    return [r["text"] for r in results], [[Segment(*s) for s in r["segments"]] for r in results]


def cold_asyncspec(
    files: Sequence[Path],
    method: str = "as2d",
    command: Sequence[str] = ASYNCSPEC_COMMAND,
    timeout_s: float | None = None,
    name: str | None = None,
) -> ColdRun:
    """asyncspec's own command line in a fresh process; `command` may name other options."""
    files = [Path(f) for f in files]
    with tempfile.TemporaryDirectory(prefix="asyncspec-cold-") as scratch:
        work = Path(scratch)
        argv = expand_command(command, files, work, method)
        return timed_process(f"asyncspec-{name or method}", argv, files, work, read_output_dir, timeout_s)


def expand_command(command: Sequence[str], files: list[Path], output_dir: Path, method: str) -> list[str]:
    """The placeholders filled in: {files} becomes one argument per file. Plain replacement, not
    str.format, so an argument with other braces in it (a `python -c` script) passes unchanged."""
    values = {"{asyncspec}": asyncspec_executable(), "{method}": method, "{output_dir}": str(output_dir)}
    argv: list[str] = []
    for part in command:
        if part == "{files}":
            argv += [str(f) for f in files]
            continue
        for placeholder, value in values.items():
            part = part.replace(placeholder, value)
        argv.append(part)
    return argv


def asyncspec_executable() -> str:
    """The `asyncspec` console script beside this interpreter (what a user of this install runs)."""
    beside = Path(sys.executable).parent / "asyncspec"
    return str(beside) if beside.is_file() else (shutil.which("asyncspec") or "asyncspec")


def read_output_dir(directory: Path, files: list[Path]) -> tuple[list[str], list[list[Segment]]]:
    """Whisper's JSON output, <stem>.json per file: {"text", "segments": [{"start", "end", "text"}]}."""
    texts, segments = [], []
    for path in files:
        output = directory / f"{path.stem}.json"
        data = json.loads(output.read_text()) if output.is_file() else {}
        texts.append(str(data.get("text", "")).strip())
        segments.append([_segment(s) for s in data.get("segments", [])])
    return texts, segments


def _segment(value) -> Segment:
    if isinstance(value, dict):
        return Segment(float(value["start"]), float(value["end"]), str(value["text"]).strip())
    start, end, text = value[:3]
    return Segment(float(start), float(end), str(text).strip())


def cold_walls(
    names: Sequence[str], files: Sequence[Path], model: str, threads: int, asyncspec_options: Sequence[str] = ()
) -> dict[str, dict]:
    """Each system once over all files in a fresh process, one after another: its wall, exit code
    and texts. asyncspec's systems run `asyncspec transcribe` with `asyncspec_options` (the warm
    run's model, dtype, encoder); faster-whisper and whisper.cpp their own entries
    (e2e.FASTER_WHISPER names encode compute type and preset)."""
    runs: dict[str, dict] = {}
    for name in names:
        print(f"cold: {name} over {len(files)} files in a fresh process", file=sys.stderr, flush=True)
        if name in ASYNCSPEC_VARIANTS:
            method, _, flags = ASYNCSPEC_VARIANTS[name]
            command = (*ASYNCSPEC_COMMAND[:-1], *asyncspec_options, *flags, ASYNCSPEC_COMMAND[-1])
            runs[name] = cold_asyncspec(files, method, command, name=name).record()
        elif name.startswith("faster-whisper-"):
            compute, _, preset = name.removeprefix("faster-whisper-").partition("-")
            runs[name] = cold_faster_whisper(files, model, compute, preset or "stripped", threads).record()
        elif name == "whisper-cpp":
            runs[name] = _cold_whisper_cpp(files, model, threads)
    return runs


# asyncspec's methods seed every fallback sample: a file's text is a function of the file and the
# configuration, so a fresh process must write the warm run's text. faster-whisper's samples are
# not seeded, and whisper.cpp's cold run is its own CLI's, so theirs may differ.
SEEDED_SYSTEMS = tuple(ASYNCSPEC_VARIANTS)


def warm_cold_differences(systems: dict) -> list[str]:
    """The files whose cold text differs from the warm one, as "system: file", for the seeded
    systems of a `bench e2e` report (a failed cold run is reported by its exit code instead)."""
    differing = []
    for name in SEEDED_SYSTEMS:
        row = systems.get(name, {})
        cold = row.get("cold")
        if cold is None or cold["returncode"] != 0:
            continue
        for record, text in zip(row["files"], cold["texts"], strict=True):
            if record["text"] != text:
                differing.append(f"{name}: {record['file']}")
    return differing


def failed_cold_runs(systems: dict) -> list[str]:
    """Every system whose fresh process failed, as "system: exit N: its last stderr line": its wall
    is no time to compare (a process that stopped on a bad option took 1.8 s where the warm run
    took 50), so the report shows the failure and the bench exits 1."""
    failed = []
    for name, row in systems.items():
        cold = row.get("cold")
        if cold is not None and cold["returncode"] != 0:
            last = (cold.get("stderr_tail") or "").strip().splitlines()[-1:] or ["no stderr"]
            failed.append(f"{name}: exit {cold['returncode']}: {last[0]}")
    return failed


def _cold_whisper_cpp(files: Sequence[Path], model: str, threads: int) -> dict:
    from asyncspec.benchmarks.e2e_whispercpp import _model_file, cold_run

    result = cold_run(_model_file(model), list(files), threads)
    return {"wall_s": round(result["wall_s"], 4), "returncode": 0, "texts": [f["text"] for f in result["files"]]}
