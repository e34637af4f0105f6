"""free_port draws below the kernel's ephemeral range (where outgoing connections take their source
ports) and never returns a port some socket already holds."""

from __future__ import annotations

import socket

from asyncspec import ports


def test_a_free_port_lies_below_the_ephemeral_range_and_binds():
    for _ in range(20):
        port = ports.free_port()
        assert ports.LOWEST_PORT <= port < ports.ephemeral_start()
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))


def test_a_held_port_is_never_returned(monkeypatch):
    """Control: the draw first lands on a port a listener holds; that port must be skipped."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        held = busy.getsockname()[1]
        draws = iter([held, held, ports.LOWEST_PORT + 7])

        class Draw:
            def randint(self, low, high):
                return next(draws)

        monkeypatch.setattr(ports.random, "SystemRandom", Draw)
        assert ports._binds("127.0.0.1", held) is False
        assert ports.free_port() == ports.LOWEST_PORT + 7
