"""`asyncspec keys DIR`: CURVE key pairs for the cloud, the edge and clients (cloudedge/auth.py)."""

from __future__ import annotations

from asyncspec.errors import InputError

HELP = "create ZeroMQ CURVE key pairs for `serve cloud|edge` and `client`"


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="folder for the key files (created if missing)")
    parser.add_argument("--names", default="cloud,edge", help="comma list of key pair names")


def run(args) -> int:
    from asyncspec.cloudedge.auth import generate_keys

    names = [n.strip() for n in args.names.split(",") if n.strip()]
    if not names or any(not n.replace("-", "").replace("_", "").isalnum() for n in names):
        raise InputError(f"--names must be a comma list of plain names, not {args.names!r}")
    for name in names:
        public, secret = generate_keys(args.directory, name)
        print(f"{name}: public {public}, secret {secret} (keep the secret file private)")
    print(
        "cloud: --curve-secret cloud.key_secret [--curve-clients DIR-with-edge.key]; "
        "edge: --curve-secret edge.key_secret --curve-server cloud.key"
    )
    return 0
