"""Arguments of the decoding commands: transcribe, generate, demo, bench methods and bench ondevice
(their shared options: run/options.py). Kept free of heavy imports: every CLI call builds them."""

from __future__ import annotations

import argparse

from asyncspec.profiling.deployed import CATALOG
from asyncspec.run.options import add_decoding_options

TASKS = ("transcribe", "translate")

TRANSCRIBE_HELP = "transcribe audio files"
GENERATE_HELP = "continue a text prompt"
DEMO_HELP = "LibriVox clips: every method side by side, exactness and WER"
METHODS_HELP = "target-only vs sd vs specasr on LibriVox or HumanEval"
ONDEVICE_HELP = "target-only vs sd vs specasr vs as2d on real-speech windows"
JSON_HELP = "write the records, the summary and the exactness verdict here as JSON"


def add_transcribe(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("audio", nargs="+", help="WAV/FLAC/OGG/MP3 files")
    parser.add_argument(
        "--language", default="auto", help="a language code, or auto: detected per file (English-only models: en)"
    )
    parser.add_argument(
        "--task", default="transcribe", choices=["transcribe", "translate"], help="translate: to English"
    )
    parser.add_argument("--initial-prompt", default=None, help="text that conditions the first window")
    parser.add_argument("--hotwords", default=None, help="words (names, terms) that condition every window")
    parser.add_argument("--vad", action="store_true", help="transcribe only the speech Silero VAD finds (times kept)")
    parser.add_argument("--word-timestamps", action="store_true", help="time every word (JSON: segments' words)")
    parser.add_argument(
        "--highlight-words", action="store_true", help="SRT/VTT: a cue per word, underlined (implies --word-timestamps)"
    )
    parser.add_argument("--json", metavar="FILE", help=JSON_HELP)
    parser.add_argument("--output-dir", metavar="DIR", help="write <name>.<format> files here")
    parser.add_argument("--output-format", default="all", help="with --output-dir: txt, srt, vtt, tsv, json or all")
    add_decoding_options(parser, "whisper-base", "whisper-tiny.en")
    # a file in, text out: once it is flushed the process may skip the interpreter's teardown (cli.entry)
    # auto: As²d where the machine leaves its producer a core of its own, else target-only (said at start)
    parser.set_defaults(method="auto", dtype="auto", threads=None, exit_without_teardown=True)
    parser.add_argument(
        "--solo-threads",
        type=int,
        default=None,
        help="the decoder's threads when no producer drafts beside it (target-only, or the producer has "
        "published the whole file); default every core, used where the self-test finds equal rows "
        "(--threads: beside the producer, default every core but one)",
    )
    add_longform_options(parser)


def add_longform_options(parser: argparse.ArgumentParser) -> None:
    """Whisper's long-form settings, with faster-whisper's defaults."""
    parser.add_argument(
        "--temperature-increment-on-fallback",
        type=float,
        default=0.2,
        help="a window that fails the checks is decoded again this much hotter, up to 1 (0: no fallback)",
    )
    parser.add_argument(
        "--best-of", type=int, default=5, help="samples per fallback temperature (the likeliest is kept)"
    )
    parser.add_argument(
        "--beam-size",
        type=int,
        default=1,
        help="temperature 0 as a beam search of this many hypotheses, CTranslate2's rule (faster-whisper's "
        "default is 5; 1, asyncspec's default, is greedy, the decoding As²d speeds up; with more, every "
        "method decodes target-only, the beams side by side in one call per step)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="batched long-form, as faster-whisper's BatchedInferencePipeline: the speech cut at VAD pauses "
        "into chunks of up to 30 s, this many decoded side by side, each on its own (no conditioning on "
        "earlier text); default: window after window, each conditioned on the text before",
    )
    parser.add_argument(
        "--patience", type=float, default=1.0, help="beam search: stop once beam size x patience hypotheses ended"
    )
    parser.add_argument(
        "--length-penalty",
        type=float,
        default=1.0,
        help="beam search: a hypothesis scores its log-probability over length ** this (0: no normalisation)",
    )
    parser.add_argument("--compression-ratio-threshold", type=float, default=2.4, help="fall back above this")
    parser.add_argument("--logprob-threshold", type=float, default=-1.0, help="fall back below this average log p")
    parser.add_argument("--no-speech-threshold", type=float, default=0.6, help="skip a silent window above this")
    parser.add_argument(
        "--condition-on-previous-text",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="prompt each window with the text before it (reset after a hot fallback)",
    )
    parser.add_argument(
        "--resume-after-early-end",
        default=True,
        action=argparse.BooleanOptionalAction,
        help="a window whose text ends over 1 s before its end is followed from there, not from its end "
        "(Whisper's rule skips that audio as silent; --no-resume-after-early-end keeps Whisper's rule)",
    )


def add_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", metavar="FILE", help=JSON_HELP)
    add_decoding_options(parser, "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")


def add_demo(parser: argparse.ArgumentParser) -> None:
    add_decoding_options(parser, "whisper-base", "whisper-tiny.en")
    parser.set_defaults(method="sd,specasr,as2d")
    parser.add_argument("--json", metavar="FILE", help="write the records, summary, WER and verdict here as JSON")


def add_bench_methods(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=["librivox", "humaneval"], default="librivox")
    parser.add_argument("--n", type=int, default=None, help="clips or prompts (default: all clips, 5 prompts)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="out", help="folder for the JSON and PNG")
    add_decoding_options(parser, None, None)
    parser.set_defaults(method="sd,specasr")


def add_bench_ondevice(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--audio", metavar="DIR", help="audio directory (default: LibriVox clips joined to 10-25 s)")
    parser.add_argument("--dev", action="store_true", help="use the Festival development set (synthesised)")
    parser.add_argument(
        "--held-out", action="store_true",
        help="the CMU recordings at their recorded rate: real speech select-budget's split never holds",
    )  # fmt: skip
    parser.add_argument("--out", default="out", help="folder for the JSON and PNGs")
    parser.add_argument("--oracle", action="store_true", help="deployed configuration vs per-window oracle")
    parser.add_argument("--profile", help="--oracle: cost profile JSON (default: the one select-budget used)")
    parser.add_argument("--catalog", default=CATALOG, help="--oracle: producers the oracle may pick from")
    add_decoding_options(parser, "whisper-base", "whisper-tiny.en")
    parser.set_defaults(method="sd,specasr,as2d")
