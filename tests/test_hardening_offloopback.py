"""Authentication off loopback, or no start: an HTTP service needs an API key on any non-loopback
bind (or a logged --insecure-no-auth), its Host allow-list holds on every bind (0.0.0.0 too), and
a ZeroMQ service (the cloud, the edge's client front) needs CURVE with a client allow-list, checked
by a ZAP authenticator. The keys `asyncspec keys` writes are the ones these tests use."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
import zmq

from asyncspec.cloudedge.auth import CurveKeys, client_keys, generate_keys, require_keys_off_loopback, server_keys
from asyncspec.cloudedge.client import ClientFront, EdgeClient, EdgeError
from asyncspec.commands import keys as keys_command
from asyncspec.errors import InputError
from asyncspec.httpguard import Guard, allowed_hosts_for, guard_config
from cloudedge_support import free_address, spawn

KEY = "a-long-enough-api-key"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    """Made by the `asyncspec keys` command itself, plus an intruder's pair it never admitted."""
    directory = tmp_path_factory.mktemp("keys")
    assert keys_command.run(argparse.Namespace(directory=str(directory), names="cloud,edge,client")) == 0
    generate_keys(directory, "intruder")
    return directory


def test_keys_writes_usable_pairs_and_allow_lists(keys):
    assert sorted(p.name for p in (keys / "cloud-clients").iterdir()) == ["edge.key"]
    assert sorted(p.name for p in (keys / "edge-clients").iterdir()) == ["client.key"]
    assert server_keys(keys / "cloud.key_secret", keys / "cloud-clients").authorized_dir is not None
    assert server_keys(keys / "edge.key_secret", keys / "edge-clients").authorized_dir is not None
    client_keys(keys / "edge.key_secret", keys / "cloud.key")
    client_keys(keys / "client.key_secret", keys / "edge.key")


def test_an_empty_allow_list_is_refused(keys, tmp_path):
    with pytest.raises(InputError, match="admit nobody"):
        server_keys(keys / "cloud.key_secret", tmp_path)


# ------------------------------------------------------------------ ZeroMQ


@pytest.mark.parametrize("address", ["tcp://0.0.0.0:5555", "tcp://10.1.2.3:5555", "tcp://*:5555"])
def test_zeromq_off_loopback_needs_curve_and_a_client_allow_list(keys, address, capsys):
    encrypted_only = server_keys(keys / "cloud.key_secret")
    for curve in (None, encrypted_only):
        with pytest.raises(InputError, match="refusing to bind"):
            require_keys_off_loopback(address, curve, "--curve-secret")
    require_keys_off_loopback(address, server_keys(keys / "cloud.key_secret", keys / "cloud-clients"), "--curve-secret")
    require_keys_off_loopback(address, encrypted_only, "--curve-secret", allow_insecure=True)
    assert "WARNING" in capsys.readouterr().err  # the escape is loud
    require_keys_off_loopback("tcp://127.0.0.1:5555", None, "--curve-secret")  # loopback: allowed


class FrontThread:
    """An edge client front polled in a thread; the Generates sent here fail their field checks,
    so the front answers them (Failed) without a gateway: an answer proves the client got in."""

    def __init__(self, curve):
        self.address = free_address()
        self.front = ClientFront(self.address, tokenizer=None, curve=curve)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.front.socket.poll(20):
                self.front.drain(None)
        self.front.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def answered(address: str, curve) -> bool:
    with EdgeClient(address, timeout_s=1.5, curve=curve) as client:
        try:
            client.generate("x", max_new_tokens=4, temperature=1e-45)  # refused at decode: a Failed reply
        except EdgeError:
            return True
        except TimeoutError:
            return False
    raise AssertionError("the front accepted an invalid temperature")


def test_the_edge_front_admits_only_listed_client_keys(keys):
    front = FrontThread(server_keys(keys / "edge.key_secret", keys / "edge-clients"))
    try:
        assert front.front.authenticator is not None
        assert answered(front.address, client_keys(keys / "client.key_secret", keys / "edge.key"))
        assert not answered(front.address, client_keys(keys / "intruder.key_secret", keys / "edge.key"))
        assert not answered(front.address, None)  # plain TCP
    finally:
        front.close()


def test_negative_control_without_an_allow_list_any_key_pair_gets_in(keys):
    """Why the allow-list is required off loopback: CURVE alone admits a self-made key pair."""
    front = FrontThread(server_keys(keys / "edge.key_secret"))
    try:
        assert front.front.authenticator is None
        public, secret = zmq.curve_keypair()  # made on the spot: listed nowhere
        assert answered(
            front.address,
            CurveKeys(
                public, secret, server_public=client_keys(keys / "client.key_secret", keys / "edge.key").server_public
            ),
        )
    finally:
        front.close()


# ------------------------------------------------------------------ HTTP


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "edge.example"])
def test_http_off_loopback_without_a_key_is_refused(host, monkeypatch, capsys):
    monkeypatch.delenv("ASYNCSPEC_API_KEY", raising=False)
    with pytest.raises(InputError, match="without an API key"):
        guard_config(host, None, 1 << 20)
    guard_config(host, None, 1 << 20, insecure_no_auth=True)
    assert "WITHOUT AUTHENTICATION" in capsys.readouterr().err
    monkeypatch.setenv("ASYNCSPEC_API_KEY", KEY)
    assert guard_config(host, None, 1 << 20).api_keys == (KEY,)
    monkeypatch.delenv("ASYNCSPEC_API_KEY")
    for loopback in ("127.0.0.1", "localhost", "::1"):
        assert guard_config(loopback, None, 1 << 20).api_keys == ()  # loopback: a key stays optional


def test_the_host_allow_list_holds_on_every_bind():
    assert set(allowed_hosts_for("0.0.0.0")) == {"127.0.0.1", "localhost", "::1", "[::1]"}
    assert "edge.example" in allowed_hosts_for("::", ("Edge.Example",))
    assert "[fd00::5]" in allowed_hosts_for("fd00::5")
    assert allowed_hosts_for("10.1.2.3")[-1] == "10.1.2.3"


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def status_of(guard: Guard, host: str, key: str | None) -> int:
    headers = [(b"host", host.encode())] + ([(b"authorization", f"Bearer {key}".encode())] if key else [])
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": headers}
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"]


def test_a_wildcard_bind_refuses_foreign_hosts_and_keyless_clients(monkeypatch):
    monkeypatch.setenv("ASYNCSPEC_API_KEY", KEY)
    guard = Guard(_ok, guard_config("0.0.0.0", None, 1 << 20, ("edge.example",)))
    assert status_of(guard, "edge.example:8000", KEY) == 200
    assert status_of(guard, "127.0.0.1:8000", KEY) == 200
    assert status_of(guard, "attacker.example:8000", KEY) == 400  # a rebound name
    assert status_of(guard, "", KEY) == 400  # no Host at all
    assert status_of(guard, "edge.example", None) == 401
    assert status_of(guard, "edge.example", "wrong-key-0123456789") == 401


# ------------------------------------------------------------------ the commands refuse to start


def _tiny_wav(path: Path) -> Path:
    soundfile.write(path, (0.3 * np.sin(np.arange(16_000) / 5)).astype(np.float32), 16_000)
    return path


def test_the_commands_refuse_to_start_off_loopback_without_authentication(keys, tmp_path, monkeypatch):
    monkeypatch.delenv("ASYNCSPEC_API_KEY", raising=False)
    curve = ["--curve-secret", str(keys / "edge.key_secret"), "--curve-server", str(keys / "cloud.key")]
    cases = {
        "client allow-list": ["serve", "cloud", "--bind", "tcp://0.0.0.0:5999",
                              "--curve-secret", str(keys / "cloud.key_secret"), "--model", "no-such-model"],
        "(--curve-clients)": ["serve", "edge", "--bind", "tcp://0.0.0.0:5998", *curve, "--model", "no-such-model"],
        "HTTP on 0.0.0.0 without an API key": ["serve", "edge", "--http", "0.0.0.0:5997", "--model", "no-such-model"],
        "HTTP on :: without an API key": ["listen", "--audio", str(_tiny_wav(tmp_path / "a.wav")), "--host", "::",
                                          "--port", "5996", "--model", "no-such-model"],
    }  # fmt: skip
    started = time.monotonic()
    processes = {reason: spawn(*argv) for reason, argv in cases.items()}
    for reason, process in processes.items():
        _, err = process.communicate(timeout=120)
        assert process.returncode == 2 and "asyncspec: error: refusing to" in err and reason in err, err
        assert err.count("\n") == 1  # one clear line
    assert time.monotonic() - started < 120
