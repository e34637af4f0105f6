"""The `asyncspec` command line: every command is one `Command` row, registered the same way."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from asyncspec.benchmarks import e2e, engines, ondemand
from asyncspec.commands import (
    bench_cloudedge,
    config,
    decoding_cli,
    keys,
    link,
    listen,
    models,
    profiling_cli,
    serve_options,
)
from asyncspec.errors import InputError, ModelNotPreparedError

EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class Command:
    """A subcommand. `arguments` fills its parser on every call, so it imports no torch (`link` and
    `keys` start in a moment); `handler` ("module:function" under asyncspec) is imported only when the
    command runs. Without a handler, the arguments add subcommands that name their own (`serve cloud`)."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    handler: str | None
    description: str | None = None


BENCHES = (
    Command("methods", decoding_cli.METHODS_HELP, decoding_cli.add_bench_methods, "benchmarks.methods:run"),
    Command("ondevice", decoding_cli.ONDEVICE_HELP, decoding_cli.add_bench_ondevice, "benchmarks.ondevice:run"),
    Command("engines", engines.HELP, engines.add_arguments, "benchmarks.engines:run"),
    Command("e2e", e2e.HELP, e2e.add_arguments, "benchmarks.e2e:run"),
    Command("cloud", bench_cloudedge.CLOUD_HELP, bench_cloudedge.add_cloud_arguments, "benchmarks.cloud_load:run"),
    Command(
        "cloudedge",
        bench_cloudedge.CLOUDEDGE_HELP,
        bench_cloudedge.add_cloudedge_arguments,
        "benchmarks.cloudedge:run",
    ),
    Command(
        "correction",
        bench_cloudedge.CORRECTION_HELP,
        bench_cloudedge.add_correction_arguments,
        "benchmarks.correction_sensitivity:run",
    ),
    Command("ondemand", ondemand.HELP, ondemand.add_arguments, "benchmarks.ondemand:run"),
)


def add_benches(parser: argparse.ArgumentParser) -> None:
    add_commands(parser, BENCHES, dest="bench")


COMMANDS = (
    Command("models", models.HELP, models.add_arguments, "commands.models:run"),
    Command("transcribe", decoding_cli.TRANSCRIBE_HELP, decoding_cli.add_transcribe, "commands.transcribe:run"),
    Command("generate", decoding_cli.GENERATE_HELP, decoding_cli.add_generate, "commands.generate:run"),
    Command("demo", decoding_cli.DEMO_HELP, decoding_cli.add_demo, "commands.demo:run"),
    Command("bench", "benchmarks that compare methods side by side in one run", add_benches, None),
    Command("profile", profiling_cli.PROFILE_HELP, profiling_cli.add_profile, "commands.profile:run"),
    Command("replay", profiling_cli.REPLAY_HELP, profiling_cli.add_replay, "commands.replay:run"),
    Command(
        "select-budget",
        profiling_cli.SELECT_BUDGET_HELP,
        profiling_cli.add_select_budget,
        "commands.select_budget:run",
    ),
    Command("config", config.HELP, config.add_arguments, None),
    Command("link", link.HELP, link.add_arguments, "commands.link:run", link.DESCRIPTION),
    Command("serve", serve_options.SERVE_HELP, serve_options.add_serve_arguments, None),
    Command("client", serve_options.CLIENT_HELP, serve_options.add_client_arguments, "commands.serve:run_client"),
    Command("listen", listen.HELP, listen.add_arguments, "commands.listen:run"),
    Command("keys", keys.HELP, keys.add_arguments, "commands.keys:run"),
)


def add_commands(parser: argparse.ArgumentParser, commands: tuple[Command, ...], dest: str) -> None:
    subparsers = parser.add_subparsers(dest=dest, required=True)
    for command in commands:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.description)
        command.arguments(sub)
        if command.handler:
            sub.set_defaults(handler=command.handler)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncspec", description="Speculative decoding that decouples drafting from verification."
    )
    add_commands(parser, COMMANDS, dest="command")
    return parser


def main(argv: list[str] | None = None) -> int:
    return _main(argv)[0]


def entry() -> None:
    """The console script. A command that asks for it (`transcribe`: its files are written, its
    producer joined) ends with os._exit once stdout and stderr are flushed: the interpreter's
    teardown of torch's modules and objects costs a fresh process about a second, and nothing
    after that point writes anything."""
    code, skip_teardown = _main(None)
    if not skip_teardown:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _main(argv: list[str] | None) -> tuple[int, bool]:
    """(exit code, whether the process may skip its teardown): only after a handler returned."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        code = _dispatch(args)
        return code, bool(getattr(args, "exit_without_teardown", False))
    except (InputError, ModelNotPreparedError) as error:
        print(f"asyncspec: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT, False
    except KeyboardInterrupt:
        print("asyncspec: interrupted", file=sys.stderr)
        return 130, False


def _dispatch(args: argparse.Namespace) -> int:
    if getattr(args, "threads", None):  # before the handler's imports: torch reads it once
        import torch

        torch.set_num_threads(args.threads)
    module, function = args.handler.split(":")
    return getattr(importlib.import_module(f"asyncspec.{module}"), function)(args)


if __name__ == "__main__":
    entry()
