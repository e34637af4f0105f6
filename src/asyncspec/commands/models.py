"""`asyncspec models list|prepare|verify`."""

from __future__ import annotations

import json

from asyncspec.errors import InputError
from asyncspec.models.offline import REGISTRY, is_installed, is_prepared, model_dir, prepare, verify

HELP = "list, prepare or verify the offline models"


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["list", "prepare", "verify"])
    parser.add_argument("names", nargs="*", help="registered names (default: all)")


def run(args) -> int:
    names = args.names or list(REGISTRY)
    unknown = [name for name in names if name not in REGISTRY]
    if unknown:
        raise InputError(f"unknown model {', '.join(unknown)}; registered: {', '.join(REGISTRY)}")
    if args.action == "list":
        return _list(names)
    if args.action == "prepare":
        for name in names:
            if not args.names and not is_installed(REGISTRY[name]):
                print(f"{name}: skipped, packages not installed ({REGISTRY[name].install_hint()})")
                continue
            prepare(name)
        return 0
    problems = [problem for name in names if is_prepared(name) or args.names for problem in verify(name)]
    for problem in problems:
        print(problem)
    print("all prepared models verified" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def _list(names: list[str]) -> int:
    for name in names:
        model = REGISTRY[name]
        state = "prepared" if is_prepared(name) else ("installed" if is_installed(model) else "not installed")
        detail = ""
        if is_prepared(name):
            manifest = json.loads((model_dir(name) / "asyncspec.json").read_text())
            detail = f" ({manifest['prepare_seconds']} s to prepare) {model_dir(name)}"
        print(f"{name:22s} {model.family:8s} {state}{detail}")
    return 0
