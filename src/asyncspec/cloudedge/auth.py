"""Authenticated, encrypted ZeroMQ between edge and cloud (and between clients and the edge): CURVE.

`asyncspec keys DIR` writes key pairs (pyzmq's certificate files: NAME.key_secret holds both
halves, NAME.key only the public one). A server socket takes its secret file and, optionally, a
folder of the public keys it admits (a ZAP authenticator checks each connecting peer; without the
folder any peer that makes itself a key pair may connect, since the server key is public). A
client takes its own secret file and the server's public file; a wrong server key never completes
the handshake.

A ZeroMQ service (the cloud, the edge's client front) bound to anything but loopback without CURVE
*and* a client allow-list is refused (`require_keys_off_loopback`): encryption alone admits anyone.

Request ownership: the cloud binds each request to the ZeroMQ routing id of the connection that
opened it. The edge gives its cloud socket a random 16-byte routing id that survives its own
reconnections (the cloud hands the id over to the new connection), so only that edge can touch
its requests; under CURVE the id never crosses the network in clear.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from asyncspec.errors import InputError

LOOPBACK_PREFIXES = ("tcp://127.", "tcp://localhost:", "tcp://[::1]:", "ipc://", "inproc://")


@dataclass(frozen=True)
class CurveKeys:
    public: bytes
    secret: bytes
    server_public: bytes | None = None  # a client: the server it trusts
    authorized_dir: str | None = None  # a server: only these clients' public keys (None: any key holder)


def generate_keys(directory: str | Path, name: str) -> tuple[Path, Path]:
    """A fresh key pair as (public file, secret file); the secret file is readable by its owner only."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def _load(path: str | Path, need_secret: bool) -> tuple[bytes, bytes | None]:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such key file (create one with `asyncspec keys`)")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as error:
        raise InputError(f"{path}: not a ZeroMQ CURVE key file ({error})") from None
    if need_secret and not secret:
        raise InputError(f"{path}: holds no secret key (use the NAME.key_secret file)")
    return public, secret


def server_keys(secret_file: str | Path, authorized_dir: str | Path | None = None) -> CurveKeys:
    public, secret = _load(secret_file, need_secret=True)
    if authorized_dir is not None and not Path(authorized_dir).is_dir():
        raise InputError(f"{authorized_dir}: not a folder of authorised public keys")
    if authorized_dir is not None and not any(Path(authorized_dir).glob("*.key")):
        raise InputError(f"{authorized_dir}: holds no public key files (NAME.key): it would admit nobody")
    return CurveKeys(public, secret, authorized_dir=None if authorized_dir is None else str(authorized_dir))


def client_keys(secret_file: str | Path, server_public_file: str | Path) -> CurveKeys:
    public, secret = _load(secret_file, need_secret=True)
    server_public, _ = _load(server_public_file, need_secret=False)
    return CurveKeys(public, secret, server_public=server_public)


def apply_curve(socket: zmq.Socket, keys: CurveKeys | None, server: bool) -> None:
    """Before bind/connect: CURVE on this socket (nothing when keys is None)."""
    if keys is None:
        return
    socket.curve_publickey, socket.curve_secretkey = keys.public, keys.secret
    if server:
        socket.curve_server = True
    else:
        if keys.server_public is None:
            raise InputError("a CURVE client needs the server's public key")
        socket.curve_serverkey = keys.server_public


def start_authenticator(context: zmq.Context, keys: CurveKeys | None):
    """A ZAP handler admitting only the authorised public keys (None when every key holder may connect)."""
    if keys is None or keys.authorized_dir is None:
        return None
    from zmq.auth.thread import ThreadAuthenticator

    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=keys.authorized_dir)
    return authenticator


def is_loopback(address: str) -> bool:
    return address.startswith(LOOPBACK_PREFIXES)


def require_keys_off_loopback(address: str, keys: CurveKeys | None, flag: str, allow_insecure: bool = False) -> None:
    """Off loopback: CURVE with a client allow-list, or an explicit, logged `--allow-insecure`."""
    if is_loopback(address) or (keys is not None and keys.authorized_dir is not None):
        return
    missing = "CURVE keys" if keys is None else "a CURVE client allow-list (--curve-clients)"
    if allow_insecure:
        print(
            f"asyncspec: WARNING: binding {address} without {missing} (--allow-insecure): "
            "any peer that reaches it can drive this service",
            file=sys.stderr,
            flush=True,
        )
        return
    raise InputError(
        f"refusing to bind {address} without {missing}: anyone who reaches it could drive this service; "
        f"create keys with `asyncspec keys DIR`, pass {flag} FILE and --curve-clients DIR, or bind to 127.0.0.1"
    )


def connection_id() -> bytes:
    """A routing id nobody else can guess (it names this edge's requests at the cloud)."""
    return b"E" + secrets.token_bytes(15)  # ZeroMQ reserves ids that start with a zero byte
