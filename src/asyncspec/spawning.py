"""Starting worker processes with `spawn` (never `fork`: a fork after torch has run can hang)
without the child re-running the user's script.

A spawned child imports the parent's `__main__` before it runs its target, so a user script that
builds a `Transcriber` at top level, without an `if __name__ == "__main__":` guard, would build one
again in every worker: multiprocessing stops that with a RuntimeError in the child, and the worker
dies. asyncspec's workers run asyncspec functions only and need nothing from `__main__`, so while a
worker starts, `__main__` is a bare module and the child has nothing of the user's to import."""

from __future__ import annotations

import sys
import types
from multiprocessing.process import BaseProcess


def start_worker(process: BaseProcess) -> None:
    """`process.start()`, with the parent's `__main__` kept out of the child."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        process.start()
    finally:
        if main is not None:
            sys.modules["__main__"] = main
        else:
            del sys.modules["__main__"]  # an embedding interpreter without one keeps none
