"""Authentication and clear exits: CURVE between edge and cloud (a peer with the wrong key is
refused), request ids owned by their connection, no plain bind off loopback, and a busy HTTP port
that exits 2 with its reason instead of hanging."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest
import zmq

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.auth import client_keys, generate_keys, require_keys_off_loopback, server_keys
from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
from asyncspec.cloudedge.edge import EdgeGateway
from asyncspec.errors import InputError
from cloudedge_support import ServiceThread, free_address, model_pair, run_requests, save_tiny, spawn
from hardening_support import NORMAL_PROMPT, NORMAL_TOKENS, POLICY, RawPeer, expected_tokens


@pytest.fixture(scope="module")
def pair():
    return model_pair(noise=0.05)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("keys")
    for name in ("cloud", "edge", "intruder"):
        generate_keys(directory, name)
    authorised = directory / "authorised"
    authorised.mkdir()
    (authorised / "edge.key").write_bytes((directory / "edge.key").read_bytes())
    return directory


@pytest.fixture(scope="module")
def curve_cloud(pair, keys):
    address = free_address()
    cloud = CloudVerifier(pair[0], CloudConfig())
    curve = server_keys(keys / "cloud.key_secret", keys / "authorised")
    thread = ServiceThread(cloud, address, curve=curve).start()
    yield address, cloud
    thread.close()


def ping_answered(address: str, curve, timeout_s: float = 1.5) -> bool:
    context = zmq.Context()
    socket_ = context.socket(zmq.DEALER)
    socket_.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        socket_.curve_publickey, socket_.curve_secretkey = curve.public, curve.secret
        socket_.curve_serverkey = curve.server_public
    socket_.connect(address)
    socket_.send(wire.encode(wire.Ping(1.0)))
    answered = bool(socket_.poll(int(timeout_s * 1000)))
    socket_.close(linger=0)
    context.term()
    return answered


def test_key_files_are_written_with_a_private_secret(keys):
    assert (keys / "cloud.key").is_file()
    assert stat.S_IMODE((keys / "cloud.key_secret").stat().st_mode) == 0o600
    with pytest.raises(InputError, match="no secret"):
        server_keys(keys / "cloud.key")


def test_the_authorised_edge_is_served_exactly_over_curve(pair, keys, curve_cloud):
    address, _ = curve_cloud
    gateway = EdgeGateway(pair[1], address, POLICY, curve=client_keys(keys / "edge.key_secret", keys / "cloud.key"))
    thread = ServiceThread(gateway).start()
    try:
        [result] = run_requests(gateway, [NORMAL_PROMPT], NORMAL_TOKENS, timeout=60)
    finally:
        thread.close()
    assert result["type"] == "done" and result["tokens"] == expected_tokens(pair[0])


def test_a_peer_with_the_wrong_curve_key_is_refused(keys, curve_cloud):
    """Refused, not slow: after the three unanswered Pings an admitted one is answered, and the
    cloud's own counters have received only the two admitted frames (the control that counts)."""
    address, cloud = curve_cloud
    admitted = client_keys(keys / "edge.key_secret", keys / "cloud.key")

    def heard() -> tuple[int, int]:  # Pings served, frames received (the module's cloud served tests before)
        return cloud.counters.pings, sum(cloud.traffic.per_peer_received.values())

    before = heard()
    assert ping_answered(address, admitted)
    assert heard() == (before[0] + 1, before[1] + 1)
    assert not ping_answered(address, client_keys(keys / "intruder.key_secret", keys / "cloud.key"))  # not admitted
    assert not ping_answered(address, client_keys(keys / "edge.key_secret", keys / "intruder.key"))  # wrong server
    assert not ping_answered(address, None)  # no CURVE at all
    assert ping_answered(address, admitted)
    assert heard() == (before[0] + 2, before[1] + 2)


def test_another_connections_request_id_gets_a_nack(pair):
    address = free_address()
    cloud = CloudVerifier(pair[0], CloudConfig())
    thread = ServiceThread(cloud, address).start()
    owner, intruder = RawPeer(address), RawPeer(address)
    try:
        owner.send_message(wire.Open(123, wire.pack_ids([3, 4]), 2, 0.0, 0, 4, 0))
        owner.send_message(wire.Ping(0.0))  # answered after the Open: request 123 is the owner's now
        owner.replies(until=lambda m: isinstance(m, wire.Pong))
        intruder.send_message(wire.Close(123))
        intruder.send_message(wire.Block(wire.BlockId(123, 3, 1, wire.Sampling().digest()), 5, wire.pack_ids([6]), b""))
        intruder.send_message(wire.Ping(0.0))  # answered after both: what came before it is all there is
        *nacks, pong = intruder.replies(timeout_s=30.0, until=lambda m: isinstance(m, wire.Pong))
    finally:
        owner.close(), intruder.close()
        thread.close()
    assert isinstance(pong, wire.Pong)
    assert [n.reason for n in nacks] == ["invalid", "invalid"] and "another connection" in nacks[0].detail
    assert 123 in cloud.requests and cloud.counters.foreign_requests == 2  # the owner's request lives on


def _opened(peer: RawPeer, request: int) -> list[wire.Message]:
    """Open `request` and return what came back before the Pong that follows it (a Nack if refused)."""
    peer.send_message(wire.Open(request, wire.pack_ids([3, 4]), 2, 0.0, 0, 4, 0))
    peer.send_message(wire.Ping(0.0))
    replies = peer.replies(timeout_s=5.0, until=lambda m: isinstance(m, wire.Pong))
    assert replies and isinstance(replies[-1], wire.Pong), "the cloud did not answer"
    return replies[:-1]


def _curve_peer(address: str, keys_dir: Path, name: str, context: zmq.Context) -> RawPeer:
    keys = client_keys(keys_dir / f"{name}.key_secret", keys_dir / "cloud.key")
    options = {"CURVE_PUBLICKEY": keys.public, "CURVE_SECRETKEY": keys.secret, "CURVE_SERVERKEY": keys.server_public}
    return RawPeer(address, context, **options)


@pytest.mark.parametrize("authenticated", [True, False])
def test_a_client_key_is_bounded_over_all_its_connections(pair, tmp_path, authenticated):
    """Three connections under one client key share its quota of 2 open requests; another key keeps
    its own. Control: with the same keys but no allow-list (no authenticator, so no key is known)
    the third connection opens a request: only the per-connection cap of 2 applies."""
    for name in ("cloud", "tenant", "other"):
        generate_keys(tmp_path, name)
    authorised = tmp_path / "authorised"
    authorised.mkdir()
    for name in ("tenant", "other"):
        (authorised / f"{name}.key").write_bytes((tmp_path / f"{name}.key").read_bytes())
    address = free_address()
    cloud = CloudVerifier(pair[0], CloudConfig(max_requests_per_peer=2, max_requests_per_key=2))
    curve = server_keys(tmp_path / "cloud.key_secret", authorised if authenticated else None)
    thread = ServiceThread(cloud, address, curve=curve).start()
    context = zmq.Context()
    first, second, third = (_curve_peer(address, tmp_path, "tenant", context) for _ in range(3))
    other = _curve_peer(address, tmp_path, "other", context)
    try:
        assert _opened(first, 1) == [] and _opened(second, 2) == []
        refused = _opened(third, 3)
        assert _opened(other, 4) == []
        if authenticated:
            first.send_message(wire.Close(1))  # a closed request gives its key's place back
            first.send_message(wire.Ping(0.0))
            first.replies(until=lambda m: isinstance(m, wire.Pong))  # the Close is handled
            reopened = _opened(third, 5)
    finally:
        for peer in (first, second, third, other):
            peer.close()
        context.term()
        thread.close()
    if authenticated:
        assert [(m.reason, "client key holds its limit" in m.detail) for m in refused] == [("full", True)]
        assert reopened == [] and sorted(cloud.quota.per_key.values()) == [1, 2]
    else:
        assert refused == [] and not cloud.quota.per_key  # control: nothing bounds the key
    assert cloud.counters.refused_opens == int(authenticated)


@pytest.mark.parametrize("address", ["tcp://0.0.0.0:5555", "tcp://10.1.2.3:5555", "tcp://*:5555"])
def test_binding_off_loopback_without_keys_is_refused(address):
    with pytest.raises(InputError, match="CURVE"):
        require_keys_off_loopback(address, None, "--curve-secret")
    require_keys_off_loopback("tcp://127.0.0.1:5555", None, "--curve-secret")  # loopback: allowed


def test_serve_cloud_off_loopback_without_keys_exits_2():
    process = spawn("serve", "cloud", "--bind", "tcp://0.0.0.0:5999", "--model", "no-such-model")
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and "asyncspec: error: refusing to bind" in err


def test_serve_edge_on_a_busy_http_port_exits_2_with_the_reason(tmp_path, pair):
    model_dir = save_tiny(pair[1], tmp_path / "drafter")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        process = spawn("serve", "edge", "--model", str(model_dir), "--http", f"127.0.0.1:{port}",
                        "--bind", free_address(), "--cloud", free_address())  # fmt: skip
        _, err = process.communicate(timeout=120)
    assert process.returncode == 2 and f"cannot serve HTTP on 127.0.0.1:{port}" in err
