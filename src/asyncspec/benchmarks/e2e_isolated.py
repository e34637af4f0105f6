"""Every system of `bench e2e` in its own worker process, as its users run it.

Two systems in one process share more than the machine: torch and CTranslate2 both call the
process's OpenMP runtime. Measured on a 2-core AMD EPYC: loading faster-whisper with
cpu_threads=2 set torch's thread count to 2, and asyncspec's 8-row decoder call then took 34-38
ms instead of 24 ms; a file's target-only transcription went from 11.8 s to 21.1 s. The other way,
asyncspec setting its encoder's threads set CTranslate2's. So the warm figures of two systems
measured in one process are each other's artefacts. Here each loader runs in a spawned worker:
the benchmark sends it one file at a time, in its interleaved order, and the worker times the
transcription itself (pickling the result is not counted). An idle worker waits on its pipe.

As²d and target-only share one worker (one target; As²d's producer is its own process, as in
`asyncspec transcribe`), and that worker checks As²d's windows against target-only's, since it
holds the target whose logits diagnose a mismatch.
"""

from __future__ import annotations

import io
import multiprocessing
import traceback
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncspec.errors import InputError
from asyncspec.spawning import start_worker


@dataclass
class WorkerReady:
    systems: dict[str, tuple[float, dict]]  # name -> (load seconds, settings)
    extras: dict = field(default_factory=dict)  # loader-specific facts (asyncspec: the encoder placement)


class SystemWorker:
    """A worker process holding the systems one loader builds; `loader(**arguments)` runs in it
    and returns (systems by name, extras)."""

    def __init__(self, loader: str, arguments: dict[str, Any]):
        context = multiprocessing.get_context("spawn")  # never fork a process that has used torch
        self._connection, child = context.Pipe()
        # not a daemon: As²d's producer is the asyncspec worker's own child; a worker whose
        # benchmark is gone sees its pipe close and exits
        self.process = context.Process(target=_serve, args=(child, loader, arguments))
        start_worker(self.process)
        child.close()
        self.ready: WorkerReady = self._reply()

    def call(self, command: str, *payload: Any) -> Any:
        self._connection.send((command, payload))
        return self._reply()

    def _reply(self) -> Any:
        try:
            status, value = self._connection.recv()
        except EOFError:
            raise RuntimeError(f"a bench e2e worker died (exit code {self.process.exitcode})") from None
        if status == "error":
            kind, message = value
            raise (InputError if kind == "InputError" else RuntimeError)(message)
        return value

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self._connection.send(("close", ()))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
        self._connection.close()


class IsolatedSystem:
    """One system in a worker, with the benchmark's interface; `timed` returns (seconds, transcript)."""

    warmup_s = 0.0

    def __init__(self, worker: SystemWorker, name: str):
        self.worker, self.name = worker, name
        self.load_s, self._settings = worker.ready.systems[name]

    def settings(self) -> dict:
        return self._settings | {"worker_pid": self.worker.process.pid}

    @property
    def extras(self) -> dict:
        return self.worker.ready.extras

    def timed(self, path: Path):
        return self.worker.call("transcribe", self.name, path)

    def timed_stream(self, paths: list[Path]) -> list:
        return self.worker.call("stream", self.name, paths)

    def close(self) -> None:
        pass  # the worker is closed once, by the benchmark


def _serve(connection, loader: str, arguments: dict) -> None:
    """The worker's loop: build the systems, then answer commands until "close"."""
    try:
        systems, extras, closer = _LOADERS[loader](**arguments)
    except Exception as error:  # reported to the benchmark, which stops with it
        connection.send(("error", (type(error).__name__, _message(error))))
        return
    connection.send(("ok", WorkerReady({n: (s.load_s, s.settings()) for n, s in systems.items()}, extras)))
    while True:
        try:
            command, payload = connection.recv()
        except EOFError:  # the benchmark is gone
            break
        if command == "close":
            break
        try:
            connection.send(("ok", _answer(systems, command, payload)))
        except Exception as error:
            connection.send(("error", (type(error).__name__, _message(error))))
    for system in systems.values():
        system.close()
    closer()


def _answer(systems: dict, command: str, payload: tuple) -> Any:
    import time

    if command == "transcribe":
        name, path = payload
        started = time.perf_counter()
        transcript = systems[name].transcribe(path)
        return time.perf_counter() - started, transcript
    if command == "stream":
        name, paths = payload
        measured, last = [], time.perf_counter()
        for transcript in systems[name].transcribe_files(paths):
            now = time.perf_counter()
            measured.append((now - last, transcript))
            last = now
        return measured
    if command == "check":
        return _check_windows(systems, *payload)
    raise ValueError(f"unknown worker command {command!r}")


def _check_windows(systems: dict, files: list[str], expected: list, got: list) -> tuple[dict, int, str]:
    """Every As²d window against target-only's, in the worker that holds the target: (the check's
    JSON, its exit code, its report's text)."""
    from asyncspec.exactness import ExactnessCheck
    from asyncspec.run.longform import check_windows

    check = ExactnessCheck(systems["target"].transcriber.target)
    for path, reference, candidate in zip(files, expected, got, strict=True):
        check_windows(check, path, "as2d", reference, candidate)
    text = io.StringIO()
    with redirect_stdout(text):
        code = check.report(text)
    return check.as_json(), code, text.getvalue()


def _message(error: Exception) -> str:
    if isinstance(error, InputError):
        return str(error)
    return f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=6)}"


def _asyncspec_loader(model: str, systems: list[str], options: dict):
    import time
    from dataclasses import asdict

    import torch

    from asyncspec.benchmarks.e2e_systems import ASYNCSPEC_VARIANTS, AsyncspecSystem
    from asyncspec.transcription.api import Transcriber

    # The Transcriber sets the decoder's threads per window (every core but the producer's while it
    # drafts, every core once it has published the file); the encoder takes its measured
    # placement's. The process's own count is the CLI's (one), for what runs outside a window.
    torch.set_num_threads(1)
    started = time.perf_counter()
    methods = tuple(dict.fromkeys(ASYNCSPEC_VARIANTS[name][0] for name in systems))
    methods = tuple(sorted(methods, key=lambda method: method != "as2d"))  # As²d's producer, if any, loads first
    transcriber = Transcriber(model, methods, **options)
    if transcriber.producer is not None:
        transcriber.producer.ready()
    load_s = time.perf_counter() - started
    target = transcriber.target
    extras = {
        "encoder": asdict(target.encoder_placement),
        "describe": f"{target.describe()}; {transcriber.describe_threads()}",
    }
    return {name: AsyncspecSystem(name, transcriber, load_s) for name in systems}, extras, transcriber.close


def _faster_whisper_loader(name: str, model: str, compute_type: str, threads: int, preset: str):
    from asyncspec.benchmarks.e2e_systems import FasterWhisperSystem

    return {name: FasterWhisperSystem(model, compute_type, threads, preset)}, {}, _nothing


def _whisper_cpp_loader(name: str, model: str, threads: int):
    from asyncspec.benchmarks.e2e_whispercpp import WhisperCppSystem

    return {name: WhisperCppSystem(model, threads)}, {}, _nothing


def _nothing() -> None:
    pass


_LOADERS: dict[str, Callable[..., tuple[dict, dict, Callable[[], None]]]] = {
    "asyncspec": _asyncspec_loader,
    "faster-whisper": _faster_whisper_loader,
    "whisper-cpp": _whisper_cpp_loader,
}
