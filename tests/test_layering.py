"""The tree's shape, read from the source (no imports run): who may import whom, and how big a
file or a function may grow before it has to be split."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "asyncspec"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60

# The lower layers below models/: models/ may import none of these.
ABOVE_MODELS = ("decoding", "ondevice", "cloudedge", "commands", "benchmarks", "run")


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def imported_modules(source: str, package: list[str]) -> set[str]:
    """Every module an `import` or `from ... import` names, relative imports resolved against
    `package` (the importing module's package, e.g. ["asyncspec", "models"])."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def imports_package(path: Path, package: str) -> bool:
    names = imported_modules(path.read_text(), ["asyncspec", *path.relative_to(PACKAGE).parent.parts])
    return any(name == package or name.startswith(package + ".") for name in names)


def test_the_import_reader_sees_absolute_relative_and_lazy_imports():
    source = "import os\nfrom asyncspec import commands\ndef f():\n    from ..run import compare\n"
    names = imported_modules(source, ["asyncspec", "models"])
    assert {"os", "asyncspec.commands", "asyncspec.run.compare"} <= names


def test_only_the_command_line_imports_the_commands():
    offenders = [
        relative(path)
        for path in sources()
        if not relative(path).startswith("commands/")
        and relative(path) != "cli.py"
        and imports_package(path, "asyncspec.commands")
    ]
    assert offenders == []


@pytest.mark.parametrize("upper", ABOVE_MODELS)
def test_models_never_import_upward(upper):
    offenders = [
        relative(path) for path in (PACKAGE / "models").rglob("*.py") if imports_package(path, f"asyncspec.{upper}")
    ]
    assert offenders == []


def test_no_source_file_is_too_long():
    too_long = {relative(path): n for path in sources() if (n := len(path.read_text().splitlines())) > MAX_FILE_LINES}
    assert too_long == {}


def test_no_function_is_too_long():
    too_long = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long[f"{relative(path)}:{node.name}"] = length
    assert too_long == {}


def test_only_the_plotting_module_imports_matplotlib():
    """plots.py picks the file-only backend once; a second `import matplotlib` elsewhere could
    load pyplot before that choice."""
    offenders = [
        relative(path) for path in sources() if relative(path) != "plots.py" and imports_package(path, "matplotlib")
    ]
    assert offenders == []


def test_figures_are_drawn_with_a_lazy_import():
    """Nothing imports plots.py at its top: the command line and the services never pay for matplotlib."""
    offenders = []
    for path in sources():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = imported_modules(ast.unparse(node), ["asyncspec", *path.relative_to(PACKAGE).parent.parts])
                if "asyncspec.plots" in names:
                    offenders.append(relative(path))
    assert offenders == []


def test_the_services_never_import_the_link_emulator():
    """cloudedge/link/ emulates the network for benchmarks and tests; a deployment has a real one."""
    services = [path for path in (PACKAGE / "cloudedge").glob("*.py")]
    offenders = [relative(path) for path in services if imports_package(path, "asyncspec.cloudedge.link")]
    assert offenders == []


def test_the_readme_layout_lists_every_package():
    readme = (PACKAGE.parents[1] / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    packages = sorted(path.parent.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("__init__.py"))
    missing = [name for name in packages if name != "." and f"`{name}/`" not in layout]
    assert missing == []


def test_building_the_command_line_imports_no_torch():
    """Every call builds the whole parser; `link` and `keys` must not pay torch's import for it."""
    import subprocess
    import sys

    probe = "import sys; from asyncspec.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    env = {"PYTHONPATH": str(PACKAGE.parent)}
    output = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert output.stdout.strip() == "False"


def test_markers_are_strict_and_every_marker_used_is_registered():
    """An unknown marker is a collection error (`--strict-markers`), so a typo cannot silently
    deselect or select tests; every marker the tests use is a registered one or pytest's own."""
    import re
    import tomllib

    config = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in config["addopts"].split()
    registered = {line.split(":")[0].strip() for line in config["markers"]}
    builtin = {"parametrize", "skipif", "skip", "xfail", "usefixtures", "filterwarnings", "timeout"}
    used = {
        m
        for path in (PACKAGE.parents[1] / "tests").glob("*.py")
        for m in re.findall(r"pytest\.mark\.(\w+)", path.read_text())
    }
    assert used - builtin <= registered, used - builtin - registered
    assert {"real", "qwen"} <= registered
