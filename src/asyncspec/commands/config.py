"""`asyncspec config show|reset`: the deployed As²d configuration that `select-budget` wrote and
every command reads (profiling/deployed.py): what it is, whether it applies to this machine, and
removing it so that the built-in default applies again."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from asyncspec.profiling.deployed import DEFAULT_PRODUCER, config_path, load_deployed

HELP = "show or remove the deployed As²d configuration (from select-budget)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help=f"print the deployed configuration ({config_path()}) and the default")
    show.set_defaults(handler="commands.config:show")
    show.add_argument("--json", metavar="FILE", help="also write what is printed as JSON")
    reset = actions.add_parser("reset", help="remove the deployed configuration: the built-in default applies")
    reset.set_defaults(handler="commands.config:reset")


def show(args) -> int:
    from asyncspec.decoding.as2d import DEFAULT_BUDGET

    path = config_path()
    default = {"producer": DEFAULT_PRODUCER, "budget": DEFAULT_BUDGET}
    config = load_deployed(path)
    builtin = f"built-in default: {DEFAULT_PRODUCER} budget {DEFAULT_BUDGET}"
    report: dict[str, Any] = {"path": str(path), "deployed": None, "built_in_default": default}
    if config is None:
        print(f"no deployed As²d configuration at {path} (`asyncspec select-budget` makes one); {builtin}")
    else:
        ignored = config.foreign_reason()
        applies = "yes" if ignored is None else f"no, it is ignored: {ignored}"
        scores = f"{config.pooled_tps:.2f} tok/s pooled replay on its development split"
        if config.default_pooled_tps is not None:
            scores += f" (the built-in default: {config.default_pooled_tps:.2f} tok/s)"
        print(f"deployed As²d configuration: {path}")
        print(f"  producer {config.producer} ({config.producer_model}), budget {config.budget}: {scores}")
        print(f"  {config.provenance()}")
        print(f"  applies to this machine: {applies}")
        print(f"  {builtin}")
        fields = {name: value for name, value in asdict(config).items() if name != "development"}
        report["deployed"] = fields | {"applies": ignored is None, "ignored": ignored}
    if args.json:
        from asyncspec.run.report import write_json

        write_json(args.json, report)
    return 0


def reset(args) -> int:
    path = config_path()
    if not path.exists():
        print(f"no deployed As²d configuration at {path}; nothing removed (the built-in default applies)")
        return 0
    path.unlink()
    print(f"removed the deployed As²d configuration {path}; the built-in default applies again")
    return 0
