"""`asyncspec keys DIR`: CURVE key pairs for the cloud, the edge and clients (cloudedge/auth.py),
plus the two allow-list folders the servers need off loopback: `cloud-clients/` (the edges the
cloud admits) and `edge-clients/` (the clients the edge's ZeroMQ front admits)."""

from __future__ import annotations

import shutil
from pathlib import Path

from asyncspec.errors import InputError

HELP = "create ZeroMQ CURVE key pairs for `serve cloud|edge` and `client`, with their allow-lists"
SERVERS = ("cloud", "edge")


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="folder for the key files (created if missing)")
    parser.add_argument(
        "--names",
        default="cloud,edge,client",
        help="comma list of key pair names (names other than cloud, edge: clients)",
    )


def run(args) -> int:
    from asyncspec.cloudedge.auth import generate_keys

    names = [n.strip() for n in args.names.split(",") if n.strip()]
    if not names or any(not n.replace("-", "").replace("_", "").isalnum() for n in names):
        raise InputError(f"--names must be a comma list of plain names, not {args.names!r}")
    directory = Path(args.directory)
    for name in names:
        public, secret = generate_keys(directory, name)
        print(f"{name}: public {public}, secret {secret} (keep the secret file private)")
    # who admits whom: the cloud admits the edge, the edge's front admits every other name
    admitted = {"cloud": [n for n in names if n == "edge"], "edge": [n for n in names if n not in SERVERS]}
    for server, clients in admitted.items():
        if server in names and clients:
            folder = directory / f"{server}-clients"
            folder.mkdir(exist_ok=True)
            for client in clients:
                shutil.copyfile(directory / f"{client}.key", folder / f"{client}.key")
            print(f"{server} admits {', '.join(clients)}: --curve-clients {folder}")
    print(_usage(directory))
    return 0


def _usage(d: Path) -> str:
    return (
        f"cloud: serve cloud --curve-secret {d}/cloud.key_secret --curve-clients {d}/cloud-clients\n"
        f"edge:  serve edge --curve-secret {d}/edge.key_secret --curve-server {d}/cloud.key "
        f"--curve-clients {d}/edge-clients\n"
        f"client: client --curve-secret {d}/client.key_secret --curve-server {d}/edge.key\n"
        "copy each machine only its own secret file and the public files it needs"
    )
