"""The per-machine cache's JSON entries (precision choice, self-test verdicts, encoder placement,
converted-model markers), written so that processes starting together (a cloud and an edge, two
replicas, test workers) never read a half-written entry, and agree on one measurement."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from asyncspec.models.offline import cache_root


def entry_path(kind: str, key: dict) -> Path:
    """Where the per-machine cache keeps the entry of `kind` measured under `key` (a digest of it)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / kind / f"{digest}.json"


def write_entry(path: Path, value: dict) -> None:
    """Replace the entry at once: a reader sees the old file or the new one, never part of one."""
    os.replace(_scratch(path, value), path)


def keep_first(path: Path, value: dict) -> dict:
    """Write `value` unless another process wrote this entry first, and return the entry that
    stands: a measurement that decides what the target computes in must be the same in every
    process of the machine, so the first one written wins. A damaged entry is replaced."""
    scratch = _scratch(path, value)
    try:
        os.link(scratch, path)  # atomic, and fails where an entry exists
        return value
    except FileExistsError:
        try:
            return json.loads(path.read_text())
        except ValueError:
            os.replace(scratch, path)
            return value
    finally:
        scratch.unlink(missing_ok=True)


def _scratch(path: Path, value: dict) -> Path:
    """`value` written whole beside `path`, under a name of this process's own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    scratch.write_text(json.dumps(value, indent=1))
    return scratch
