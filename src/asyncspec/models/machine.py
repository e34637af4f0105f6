"""This CPU as the per-machine measurements know it: its model and instruction-set flags. Kernels,
and so speeds and the self-test's verdict, change with either. No torch here: the command line's
`config show` reads it too."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

_WANTED = ("model name", "flags")


def _cpuinfo_lines() -> list[str] | None:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None


def cpu_identity() -> str:
    """The CPU's model name and flags (every distinct line), or the platform's processor name."""
    lines = _cpuinfo_lines()
    if lines is None:
        return platform.processor()
    return "|".join(sorted({line for line in lines if line.split(":")[0].strip() in _WANTED}))


def cpu_model() -> str:
    """The CPU's model name, for people."""
    lines = _cpuinfo_lines() or []
    names = (line.split(":", 1)[1].strip() for line in lines if line.split(":")[0].strip() == "model name")
    return next(names, "") or platform.processor()


def cpu_family_model() -> str:
    """ "family F model M" from /proc/cpuinfo ("" where it has none): "AMD EPYC" alone names Zen 2,
    3 and 4 alike, and their speeds differ by kind."""
    fields: dict[str, str] = {}
    for line in _cpuinfo_lines() or []:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "cpu family" not in fields or "model" not in fields:
        return ""
    return f"family {fields['cpu family']} model {fields['model']}"


def cpu_fingerprint() -> str:
    """A short digest of `cpu_identity`: equal on CPUs of one model with the same flags."""
    return hashlib.sha256(cpu_identity().encode()).hexdigest()[:16]
