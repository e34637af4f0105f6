"""How a sandboxed program is confined (sandbox.py runs it): namespaces first, then mounts, then
the program's own credentials and limits, in this order because each step needs the privilege the
next one gives up.

1. In the child the scorer forks (`confine`, before exec): a session of its own, death with the
   scorer (PR_SET_PDEATHSIG), `unshare` of the mount, network and PID namespaces (and a user
   namespace when the scorer is unprivileged), every file system remounted read-only but the
   scratch directory, resource limits. Root keeps its privilege until this is done: dropping it
   first (as before) made the namespaces fail and the program ran with the network open.
2. The launcher (`LAUNCHER`, a small interpreter) forks the program, which is PID 1 of the new PID
   namespace: it mounts a fresh /proc (only its own processes are visible), takes the uid of
   `nobody` where it can, enters one more user namespace (which owns nothing of ours, so no
   capability it keeps can undo the mounts), caps its process count (RLIMIT_NPROC, counted per
   user namespace), sets no_new_privs and PR_SET_PDEATHSIG, and execs the program. When PID 1
   exits, the kernel kills everything else in the namespace, `setsid` or not. Without a PID
   namespace the launcher is a child subreaper and kills every descendant it finds.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from dataclasses import dataclass

CPU_MARGIN_S = 1  # CPU seconds beyond the wall-clock timeout before the kernel kills it
MEMORY_BYTES = 1 << 30  # address space: the interpreter needs ~30 MB; HumanEval tests far less than 1 GB
FILE_BYTES = 1 << 20  # largest file it may write (its output files too)
OPEN_FILES = 64
PROCESSES = 32  # RLIMIT_NPROC for the program (it counts per user namespace since Linux 5.14)
NOBODY = 65534
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Isolation:
    namespaces: int = 0  # CLONE_* flags
    read_only: bool = False  # every mount but the scratch directory remounted read-only

    @property
    def network(self) -> bool:
        return bool(self.namespaces & CLONE_NEWNET)

    @property
    def processes(self) -> bool:
        """The program runs in its own PID namespace (with its own /proc): it sees and signals nothing of ours."""
        return bool(self.namespaces & CLONE_NEWPID)

    @property
    def contained(self) -> bool:
        """No network, no process of ours, no file of ours writable: what scoring requires by default."""
        return self.network and self.processes and self.read_only

    def command(self, arguments: list[str]) -> list[str]:
        """The launcher's flags: P mount a fresh /proc; U the program must enter a user namespace of
        its own (it would otherwise keep capabilities over our mounts: root, or a namespaced launcher)."""
        flags = "P" if self.processes and self.namespaces & CLONE_NEWNS else ""
        uid = drop_to()
        if self.namespaces & CLONE_NEWUSER or (os.geteuid() == 0 and uid < 0):
            flags += "U"
        return [sys.executable, "-I", "-S", "-c", LAUNCHER, flags or "-", str(uid), str(PROCESSES),
                program_interpreter(), *arguments]  # fmt: skip


# strongest first; the first one this machine grants is used for every program
STRATEGIES = (
    Isolation(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID, read_only=True),  # root
    Isolation(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID, read_only=True),  # user namespaces
    Isolation(CLONE_NEWNS | CLONE_NEWNET, read_only=True),
    Isolation(CLONE_NEWUSER | CLONE_NEWNET),
    Isolation(CLONE_NEWNET),
    Isolation(),
)

LAUNCHER = r"""import ctypes, os, resource, signal, sys  # every import before the uid changes (ours may be unreadable)
libc = ctypes.CDLL(None, use_errno=True)
fresh_proc, need_userns = "P" in sys.argv[1], "U" in sys.argv[1]
uid, processes, python = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def descendants():
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                parents[int(entry)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the program stay ours to kill
pid = os.fork()
if pid == 0:
    if fresh_proc and libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None) != 0:
        os._exit(72)
    if uid >= 0:
        os.setgroups([]); os.setgid(uid); os.setuid(uid)
    if libc.unshare(0x10000000) != 0 and need_userns:
        os._exit(73)  # still privileged over the mounts: never run the program so
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG, after the last credential change
    os.execv(python, [python, "-I", "-S", *sys.argv[5:]])
status = os.waitpid(pid, 0)[1]
for _ in range(20):
    if fresh_proc:
        break  # PID 1 is gone: the kernel killed the rest of its namespace
    left = descendants()
    if not left:
        break
    for other in left:
        try:
            os.kill(other, signal.SIGKILL)
        except OSError:
            pass
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
if os.WIFSIGNALED(status):
    if os.WTERMSIG(status) != signal.SIGKILL:
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)  # Python ignores some (SIGXFSZ, SIGPIPE)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def limits(timeout_s: float) -> list[tuple[int, tuple[int, int]]]:
    cpu = int(timeout_s) + CPU_MARGIN_S
    return [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL at the hard one
        (resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES)),
        (resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES)),
        (resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]


def others_can_run(path: str) -> bool:
    directory = os.path.dirname(path)
    while directory not in ("/", ""):
        if not os.stat(directory).st_mode & 0o001:
            return False
        directory = os.path.dirname(directory)
    return bool(os.stat(path).st_mode & 0o001)


def program_interpreter() -> str:
    """This interpreter, or when `nobody` may not execute it (one under /root) the system's of the
    same version: a program run as `nobody` loses root's file access and its process cap binds
    (the kernel exempts uid 0 from RLIMIT_NPROC in every namespace)."""
    own = os.path.realpath(sys.executable)
    if os.geteuid() != 0 or others_can_run(own):
        return own
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.isfile(candidate) and others_can_run(os.path.realpath(candidate)):
            return candidate
    return own


def drop_to() -> int:
    """The uid the program takes (`nobody` when the scorer is root and nobody may run the interpreter; -1: none)."""
    return NOBODY if os.geteuid() == 0 and others_can_run(os.path.realpath(program_interpreter())) else -1


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: bytes | None, target: bytes, flags: int) -> bool:
    return _libc().mount(source, target, None, flags, None) == 0


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


def confine(timeout_s: float, isolation: Isolation, scratch: str):
    """The child's first act (before exec): session, namespaces, mounts, then limits it cannot raise."""

    def apply() -> None:
        os.setsid()
        _libc().prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL when the scorer dies
        if isolation.namespaces and _libc().unshare(isolation.namespaces) != 0:
            os._exit(70)  # isolation() promised it; never run unconfined by surprise
        if isolation.read_only and not _read_only_except(scratch):
            os._exit(71)
        os.chdir(scratch)  # again: the directory entered before the bind mount is the read-only one
        for limit, value in limits(timeout_s):
            resource.setrlimit(limit, value)

    return apply
