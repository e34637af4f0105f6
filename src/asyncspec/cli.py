"""The `asyncspec` command line."""

from __future__ import annotations

import argparse
import sys

from asyncspec.commands import bench_cloudedge, keys, serve
from asyncspec.commands import link as link_command
from asyncspec.errors import InputError, ModelNotPreparedError
from asyncspec.profiling.deployed import CATALOG

EXIT_BAD_INPUT = 2


def _decoding_options(parser: argparse.ArgumentParser, default_model: str | None, default_drafter: str | None) -> None:
    parser.add_argument("--model", default=default_model, help="registered name, local directory or HF id")
    parser.add_argument("--method", default="target", help="comma list of: target, sd, specasr, as2d")
    parser.add_argument("--drafter", default=default_drafter, help="drafter model for sd/specasr")
    parser.add_argument("--budget", type=int, default=None, help="proposals per round (sd: 7, specasr cap: 24)")
    parser.add_argument("--compare", action="store_true", help="also run target-only, check equality, print a table")
    parser.add_argument("--trace", metavar="FILE", help="save every decode's stage events as JSON")
    parser.add_argument(
        "--producer",
        default=None,
        choices=["ct2-chunk", "autoregressive"],
        help="as2d: chunked CTranslate2 recogniser, or a transformers drafter over the whole window "
        "(default: the deployed configuration from select-budget, else ct2-chunk)",
    )
    parser.add_argument("--producer-model", default="whisper-tiny.en", help="as2d: the producer's recogniser")
    parser.add_argument(
        "--chunk-s", type=float, default=None, help="as2d: seconds of audio per chunk (default: deployed, else 4)"
    )
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16"])
    parser.add_argument(
        "--encoder",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="speech models: the encoder's dtype (auto: the faster on this machine, measured once and cached)",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the target (one core each)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line per window and method")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncspec", description="Speculative decoding that decouples drafting from verification."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    models = commands.add_parser("models", help="list, prepare or verify the offline models")
    models.add_argument("action", choices=["list", "prepare", "verify"])
    models.add_argument("names", nargs="*", help="registered names (default: all)")

    transcribe = commands.add_parser("transcribe", help="transcribe audio files")
    transcribe.add_argument("audio", nargs="+", help="WAV/FLAC/OGG/MP3 files")
    transcribe.add_argument("--language", default="en")
    _decoding_options(transcribe, "whisper-base", "whisper-tiny.en")

    generate = commands.add_parser("generate", help="continue a text prompt")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=int, default=128)
    _decoding_options(generate, "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")

    demo = commands.add_parser("demo", help="LibriVox clips: every method side by side, exactness and WER")
    _decoding_options(demo, "whisper-base", "whisper-tiny.en")
    demo.set_defaults(method="sd,specasr,as2d", json=None)
    demo.add_argument("--json-file", dest="json", metavar="FILE", help="write records, summary and WER as JSON")
    bench = commands.add_parser("bench", help="benchmarks that compare methods side by side in one run")
    benches = bench.add_subparsers(dest="bench", required=True)
    methods = benches.add_parser("methods", help="target-only vs sd vs specasr on LibriVox or HumanEval")
    methods.add_argument("--workload", choices=["librivox", "humaneval"], default="librivox")
    methods.add_argument("--n", type=int, default=None, help="clips or prompts (default: all clips, 5 prompts)")
    methods.add_argument("--max-new-tokens", type=int, default=128)
    methods.add_argument("--out", default="out", help="folder for the JSON and PNG")
    _decoding_options(methods, None, None)
    methods.set_defaults(method="sd,specasr", json=False)
    ondevice = benches.add_parser("ondevice", help="target-only vs sd vs specasr vs as2d on real-speech windows")
    ondevice.add_argument("--audio", metavar="DIR", help="audio directory (default: LibriVox clips joined to 10-25 s)")
    ondevice.add_argument("--dev", action="store_true", help="use the Festival development set (synthesised)")
    ondevice.add_argument("--out", default="out", help="folder for the JSON and PNGs")
    ondevice.add_argument("--oracle", action="store_true", help="deployed configuration vs per-window oracle")
    ondevice.add_argument("--profile", help="--oracle: cost profile JSON (default: the one select-budget used)")
    ondevice.add_argument("--catalog", default=CATALOG, help="--oracle: producers the oracle may pick from")
    _decoding_options(ondevice, "whisper-base", "whisper-tiny.en")
    ondevice.set_defaults(method="sd,specasr,as2d", json=False)
    from asyncspec.benchmarks import e2e as e2e_bench
    from asyncspec.benchmarks import engines as engines_bench
    from asyncspec.benchmarks import ondemand as ondemand_bench
    from asyncspec.commands import listen

    engines_bench.add_arguments(benches.add_parser("engines", help=engines_bench.HELP))
    e2e_bench.add_arguments(benches.add_parser("e2e", help=e2e_bench.HELP))

    bench_cloudedge.add_parsers(benches)
    from asyncspec.commands.profiling_cli import add_profile, add_replay, add_select_budget

    for add in (add_profile, add_replay, add_select_budget):
        add(commands)
    link_command.add_parser(commands)
    serve.add_commands(commands)
    ondemand_bench.add_arguments(benches.add_parser("ondemand", help=ondemand_bench.HELP), _decoding_options)
    listen.add_arguments(commands.add_parser("listen", help=listen.HELP), _decoding_options)
    keys.add_arguments(commands.add_parser("keys", help=keys.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return _dispatch(args)
    except (InputError, ModelNotPreparedError) as error:
        print(f"asyncspec: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("asyncspec: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "link":  # before the imports below: the link proxy needs no torch
        return link_command.run(args)
    if args.command == "keys":
        return keys.run(args)
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    from asyncspec.commands import demo, generate, models, transcribe
    from asyncspec.decoding.methods import parse_methods

    if hasattr(args, "method"):
        args.methods = parse_methods(args.method)
    if hasattr(args, "chunk_s"):  # the decoding commands' As²d options
        from asyncspec.profiling.deployed import apply_deployed

        apply_deployed(args)

    from asyncspec.commands import listen, profile, replay, select_budget

    handlers = {
        "models": models.run,
        "transcribe": transcribe.run,
        "generate": generate.run,
        "demo": demo.run,
        "profile": profile.run,
        "replay": replay.run,
        "select-budget": select_budget.run,
        "serve": serve.run,
        "client": serve.run,
        "listen": listen.run,
    }
    if args.command == "bench" and args.bench == "ondemand":
        from asyncspec.benchmarks import ondemand as ondemand_bench

        return ondemand_bench.run(args)
    if args.command == "bench" and args.bench == "engines":
        from asyncspec.benchmarks import engines as engines_bench

        return engines_bench.run(args)
    if args.command == "bench" and args.bench == "e2e":
        from asyncspec.benchmarks import e2e as e2e_bench

        return e2e_bench.run(args)
    if args.command == "bench" and args.bench in ("cloudedge", "correction"):
        return bench_cloudedge.run(args)
    if args.command == "bench":
        from asyncspec.benchmarks import methods as methods_bench
        from asyncspec.benchmarks import ondevice as ondevice_bench

        return {"methods": methods_bench.run, "ondevice": ondevice_bench.run}[args.bench](args)
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
