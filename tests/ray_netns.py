"""Running a Ray-using command where loopback is the only network: a fresh network namespace
(`unshare --net`, as root) with only `lo` up. This workplace allows traffic only on loopback, and
Ray 2.60 binds and advertises the machine's external address even when asked for 127.0.0.1; in
such a namespace 127.0.0.1 is the only address there is."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def netns_problem() -> str | None:
    """Why a loopback-only namespace cannot be made here (None: it can)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (the optional extra: pip install '.[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "`unshare` or `ip` is missing (util-linux, iproute2)"
    probe = subprocess.run(
        ["unshare", "--net", "sh", "-c", "ip link set lo up"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        return f"`unshare --net` is not permitted here: {probe.stderr.strip()[:200]}"
    return None


def run_in_loopback_netns(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """`argv` (a Python script and its arguments) with this interpreter, this tree's sources, inside a
    namespace that has only loopback."""
    command = " ".join(shlex.quote(part) for part in [sys.executable, *argv])
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        ["unshare", "--net", "sh", "-c", f"ip link set lo up && exec {command}"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
