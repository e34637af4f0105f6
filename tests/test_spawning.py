"""Workers start from a user's script that has no `if __name__ == "__main__":` guard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import multiprocessing, time
from asyncspec.spawning import start_worker

worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
{start}
worker.join(60)
print("exit code", worker.exitcode)
"""


@pytest.mark.parametrize(("start", "code"), [("start_worker(worker)", 0), ("worker.start()", 1)])
def test_a_worker_started_from_an_unguarded_script_runs(tmp_path: Path, start: str, code: int):
    """start_worker: the child runs its target and exits 0. Control: a plain start re-runs the
    script in the child, whose own start raises multiprocessing's bootstrapping RuntimeError."""
    (tmp_path / "script.py").write_text(SCRIPT.format(start=start))
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"exit code {code}", done.stdout + done.stderr
    assert ("bootstrapping phase" in done.stderr) == (code != 0)


def test_start_worker_gives_the_parent_its_main_module_back():
    import multiprocessing
    import time

    from asyncspec.spawning import start_worker

    main = sys.modules["__main__"]
    worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    start_worker(worker)
    worker.join(60)
    assert sys.modules["__main__"] is main and worker.exitcode == 0
