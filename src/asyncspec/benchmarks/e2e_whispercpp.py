"""whisper.cpp (through pywhispercpp, whose wheel bundles it) as a peer system of `asyncspec bench
e2e`, on the same Whisper weights converted into its ggml file (asyncspec.models.ggml_whisper).

It runs the way whisper.cpp's CLI runs with no options, not the way asyncspec decodes: a peer is
measured as its users run it. whisper-cli (1.8.5, the version this wheel bundles) starts from the
library's greedy defaults and switches to beam search because its --beam-size defaults to 5:
beam 5, best-of 5 for the temperature fallback (0.0 then +0.2 steps when a window's entropy > 2.4
or its mean log-probability < -1.0; no-speech threshold 0.6), timestamps on (its own long-form
seek, not fixed 30 s windows), no conditioning on the previous window's text (no_context), flash
attention on. pywhispercpp's own defaults differ: greedy unless asked, and asking for beam search
gives the library's beam defaults, whose best-of is -1; both are set here as the CLI has them.

A cold run starts a fresh interpreter that loads the file and transcribes a list of files,
printing JSON, so a caller can time a user's whole command, model load included.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from asyncspec.benchmarks.e2e_systems import Segment, StreamingSystem, Transcript
from asyncspec.errors import InputError

PYWHISPERCPP_HINT = "pip install 'asyncspec[bench]'  (or: pip install pywhispercpp==1.5.1)"
BEAM_SIZE = 5  # whisper-cli's --beam-size default
BEST_OF = 5  # whisper-cli's --best-of default (the greedy default of whisper_full_default_params)
# whisper.cpp's segment times count 10 ms steps.
TIME_UNIT_S = 0.01
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def available() -> bool:
    """Whether pywhispercpp (and with it whisper.cpp) is installed."""
    return importlib.util.find_spec("pywhispercpp") is not None


def cli_settings(threads: int) -> dict:
    """The decode parameters pywhispercpp forwards to whisper_full_params, as whisper-cli sets them."""
    return {
        "n_threads": threads,
        "language": "en",
        "translate": False,
        "no_context": True,
        "no_timestamps": False,
        "temperature": 0.0,
        "temperature_inc": 0.2,
        "entropy_thold": 2.4,
        "logprob_thold": -1.0,
        "no_speech_thold": 0.6,
        "greedy": {"best_of": BEST_OF},
        "beam_search": {"beam_size": BEAM_SIZE, "patience": -1.0},
        "print_progress": False,
        "print_realtime": False,
    }


def loads_in_whispercpp(model_file: Path, timeout_s: float = 120.0) -> bool:
    """Whether whisper.cpp accepts the file. It is asked in a child process: pywhispercpp wraps a
    refused load's null context as an object and crashes the process on its first use."""
    probe = (
        "import sys, _pywhispercpp as pw\n"
        "ctx = pw.whisper_init_from_file_with_params(sys.argv[1], pw.whisper_context_default_params())\n"
        "print(pw.whisper_model_n_vocab(ctx))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(model_file)], capture_output=True, text=True, timeout=timeout_s
    )
    return result.returncode == 0 and result.stdout.strip().isdigit()


class WhisperCppSystem(StreamingSystem):
    """pywhispercpp's Model on the ggml file of `model` (a registered name, or a ggml file path)."""

    def __init__(self, model: str, threads: int, check_load: bool = True):
        from pywhispercpp.model import Model

        self.model_file = _model_file(model)
        # Outside the timed load: a file whisper.cpp refuses would otherwise end the whole bench.
        if check_load and not loads_in_whispercpp(self.model_file):
            raise InputError(f"{self.model_file}: whisper.cpp refuses this model file")
        self.threads = threads
        started = time.perf_counter()
        self.model = Model(
            str(self.model_file),
            params_sampling_strategy=1,  # beam search, as whisper-cli with its default --beam-size 5
            redirect_whispercpp_logs_to=None,
            **cli_settings(threads),
        )
        self.load_s = time.perf_counter() - started

    def settings(self) -> dict:
        from importlib.metadata import version

        settings = cli_settings(self.threads) | {"strategy": "beam_search", "model_file": str(self.model_file)}
        return settings | {"pywhispercpp": version("pywhispercpp"), "whisper_cpp": whisper_cpp_version()}

    def transcribe(self, path: Path) -> Transcript:
        from asyncspec.audio import load_audio

        # asyncspec's reader (any rate, any format libsndfile reads), so every system gets the same samples.
        segments = self.model.transcribe(load_audio(path))
        spans = [
            Segment(segment.t0 * TIME_UNIT_S, segment.t1 * TIME_UNIT_S, segment.text.strip()) for segment in segments
        ]
        return Transcript(" ".join(span.text for span in spans).strip(), segments=spans)

    def close(self) -> None:
        del self.model


def _model_file(model: str) -> Path:
    candidate = Path(model)
    if candidate.suffix == ".bin":
        # Never a name: pywhispercpp downloads a model for any path that is not an existing file.
        if not candidate.is_file():
            raise InputError(f"{model}: no such ggml model file")
        return candidate.resolve()
    from asyncspec.models.ggml_whisper import ggml_file

    return ggml_file(model)


def whisper_cpp_version() -> str:
    """The bundled libwhisper's version, from its file name in the wheel (the binding has no call for it)."""
    from importlib.metadata import files

    names = [Path(str(f)).name for f in files("pywhispercpp") or []]
    versions = [name.rsplit(".so.", 1)[1] for name in names if name.startswith("libwhisper") and ".so." in name]
    return max(versions, key=len, default="unknown")


def cold_command(model_file: Path, paths: list[Path], threads: int) -> list[str]:
    """The command of a cold run: a fresh interpreter, this module's main."""
    files = [str(Path(path).resolve()) for path in paths]
    main_module = ["-m", "asyncspec.benchmarks.e2e_whispercpp"]
    return [sys.executable, *main_module, str(model_file), "--threads", str(threads), *files]


def cold_run(model_file: Path, paths: list[Path], threads: int, timeout_s: float = 600.0) -> dict:
    """One cold run: its JSON (load_s, per file text, segments, seconds) plus wall_s, the seconds from
    the process's start to its exit as the caller saw them (interpreter start and model load included)."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    result = subprocess.run(
        cold_command(model_file, paths, threads), capture_output=True, text=True, timeout=timeout_s, env=env
    )
    wall_s = time.perf_counter() - started
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"whisper.cpp cold run failed (exit {result.returncode}): {tail}")
    return json.loads(result.stdout.strip().splitlines()[-1]) | {"wall_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="whisper.cpp cold run: load, transcribe, print JSON")
    parser.add_argument("model_file")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    # The caller built and vetted the file; a second probe would only add to the time it measures.
    system = WhisperCppSystem(args.model_file, args.threads, check_load=False)
    records = []
    for path in args.files:
        started = time.perf_counter()
        transcript = system.transcribe(Path(path))
        seconds = time.perf_counter() - started
        records.append({"path": path, "text": transcript.text, "segments": transcript.segments, "seconds": seconds})
    print(json.dumps({"load_s": system.load_s, "settings": system.settings(), "files": records}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
