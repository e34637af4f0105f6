"""The arguments of `asyncspec serve cloud|edge` and `asyncspec client` (their runs: serve.py), and the
connection options `listen` shares with them."""

from __future__ import annotations

import argparse

from asyncspec.errors import InputError
from asyncspec.run.options import add_dtype_option

SERVE_HELP = "run the AsymSpec cloud verifier or edge gateway"
CLIENT_HELP = "send a prompt to an edge gateway"


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    roles = serve.add_subparsers(dest="role", required=True)
    cloud = roles.add_parser("cloud", help="cloud verifier: the target model, batch steps over many requests")
    cloud.set_defaults(handler="commands.serve:run_cloud")
    cloud.add_argument("--model", default="qwen2.5-coder-1.5b", help="target: registered name, directory or HF id")
    cloud.add_argument("--bind", default="tcp://127.0.0.1:5555")
    cloud.add_argument("--max-batch", type=int, default=32, help="blocks per batch step")
    cloud.add_argument(
        "--max-stack",
        type=int,
        default=8,
        help="blocks stacked into one target call where the self-test's batch check passes (1: a call per request)",
    )
    cloud.add_argument("--max-queue", type=int, default=1024, help="queued blocks before back-pressure")
    cloud.add_argument("--batch-wait-ms", type=float, default=0.0, help="wait for more blocks before a forward")
    cloud.add_argument("--metrics-port", type=int, metavar="PORT", help="Prometheus metrics on 127.0.0.1:PORT/metrics")
    cloud.add_argument("--record-traffic", metavar="FILE", help="write the frames received and sent at exit")
    _cloud_limits(cloud)
    _replica_options(cloud)
    _curve_options(cloud, server=True)
    _model_options(cloud)
    edge = roles.add_parser("edge", help="edge gateway: the drafter, requests, scheduling, HTTP API")
    edge.set_defaults(handler="commands.serve:run_edge")
    edge.add_argument("--model", default="qwen2.5-coder-0.5b", help="drafter: registered name, directory or HF id")
    edge.add_argument("--cloud", default="tcp://127.0.0.1:5555", help="the cloud verifier's address")
    edge.add_argument("--bind", default="tcp://127.0.0.1:5556", help="ZeroMQ address for `asyncspec client`")
    edge.add_argument("--http", metavar="HOST:PORT", help="also serve the OpenAI-compatible HTTP API")
    edge.add_argument("--block-size", type=int, default=7, help="candidates per block (gamma)")
    edge.add_argument("--k-schedule", default="16,64,256,1024", help="top-K support sizes, growing")
    edge.add_argument("--proposals", type=int, default=32, help="exact-recovery proposals per query (0: none)")
    edge.add_argument("--uplink", choices=["compact", "full"], default="compact", help="full: baseline uplink")
    edge.add_argument("--full-correction", action="store_true", help="ablation: full distribution on every rejection")
    edge.add_argument("--no-pipeline", action="store_true", help="ablation: one open block across all requests")
    edge.add_argument("--adaptive-gamma", action="store_true", help="block length per request from its acceptance")
    edge.add_argument("--preset", help="a benchmark method preset (asymspec, standard, runahead, cosine, ablations)")
    edge.add_argument("--dead-after", type=float, default=30.0, help="seconds of cloud silence before resubmitting")
    edge.add_argument("--give-up", type=float, default=300.0, help="seconds of cloud silence before failing requests")
    _http_options(edge)
    _curve_options(edge, server=False)
    _model_options(edge)


def add_client_arguments(client: argparse.ArgumentParser) -> None:
    client.add_argument("--edge", default="tcp://127.0.0.1:5556")
    client.add_argument("--prompt", required=True)
    client.add_argument("--max-new-tokens", type=int, default=128)
    client.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    client.add_argument("--seed", type=int, default=0)
    client.add_argument("--eps-req", type=float, default=0.0, help="per-request TV budget for bounded corrections")
    client.add_argument("--timeout", type=float, default=600.0)
    client.add_argument("--json", metavar="FILE", help="write the result and its statistics here as JSON")
    client.add_argument("--curve-secret", metavar="FILE", help="this client's CURVE secret key file")
    client.add_argument("--curve-server", metavar="FILE", help="the edge's CURVE public key file")


def _cloud_limits(parser: argparse.ArgumentParser) -> None:
    from asyncspec.cloudedge import limits

    parser.add_argument("--max-block", type=int, default=64, help="candidates per block (the verification width)")
    parser.add_argument("--max-requests", type=int, default=limits.DEFAULT_MAX_REQUESTS, help="open requests")
    parser.add_argument(
        "--max-requests-per-peer", type=int, default=limits.DEFAULT_MAX_REQUESTS_PER_PEER, help="per connection"
    )
    parser.add_argument(
        "--max-requests-per-key",
        type=int,
        default=limits.DEFAULT_MAX_REQUESTS_PER_KEY,
        help="per authenticated client key (--curve-clients), over all of its connections",
    )
    parser.add_argument(
        "--kv-budget-mib", type=float, help="KV the open requests may reserve (default: half the RAM or GPU memory)"
    )
    parser.add_argument(
        "--max-message-bytes", type=int, default=limits.DEFAULT_MAX_MESSAGE_BYTES, help="largest frame accepted"
    )
    parser.add_argument(
        "--reply-cache-bytes", type=int, default=limits.DEFAULT_REPLY_CACHE_BYTES, help="cached replies, in bytes"
    )


def _replica_options(parser: argparse.ArgumentParser) -> None:
    """`--replicas N`: N verifier replicas as Ray actors behind this front (needs the ray extra)."""
    parser.add_argument("--replicas", type=int, metavar="N", help="verifier replicas on Ray (default: one process)")
    parser.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (default: an embedded local one)")
    parser.add_argument("--replica-threads", type=int, default=1, help="torch threads (and Ray CPUs) per replica")
    parser.add_argument("--replica-restarts", type=int, default=3, help="times Ray restarts a dead replica")
    # the negative controls of the replica tests: routing by frame instead of by request; no resync on a death
    parser.add_argument("--unsticky-routing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-resync-on-death", action="store_true", help=argparse.SUPPRESS)


def _curve_options(parser: argparse.ArgumentParser, server: bool) -> None:
    parser.add_argument("--curve-secret", metavar="FILE", help="this service's CURVE secret key (asyncspec keys)")
    clients = "edges" if server else "clients of --bind"
    parser.add_argument("--curve-clients", metavar="DIR", help=f"admit only the {clients} whose public keys are here")
    if not server:
        parser.add_argument("--curve-server", metavar="FILE", help="the cloud's CURVE public key file")
    parser.add_argument(
        "--allow-insecure",
        action="store_true",
        help="bind ZeroMQ off loopback without CURVE and a client allow-list (trusted networks only; logged)",
    )


def add_http_auth_options(parser: argparse.ArgumentParser) -> None:
    """Shared with `listen`: who may use an HTTP service bound off loopback, and by which Host names."""
    from asyncspec.httpguard import DEFAULT_MAX_REQUESTS_PER_KEY

    parser.add_argument(
        "--allow-host", "--allowed-host", action="append", default=[], help="a Host name clients use (repeatable)"
    )
    parser.add_argument(
        "--insecure-no-auth", action="store_true", help="serve HTTP off loopback with no API key (loud in the log)"
    )
    parser.add_argument(
        "--max-requests-per-api-key",
        type=int,
        default=DEFAULT_MAX_REQUESTS_PER_KEY,
        help="requests in flight per API key (429 beyond)",
    )


def add_connection_options(parser: argparse.ArgumentParser, prefix: str, body_timeout_s: float = 60.0) -> None:
    """The connection guard's deadlines and caps (connguard.py), for both HTTP services."""
    parser.add_argument(f"{prefix}header-timeout", type=float, default=10.0, help="seconds for a request head (408)")
    parser.add_argument(f"{prefix}body-timeout", type=float, default=body_timeout_s, help="seconds for a body (408)")
    parser.add_argument(f"{prefix}max-per-address", type=int, default=32, help="open connections per client address")


def connection_limits(args, prefix: str, max_body_bytes: int | None = None):
    """The guard's limits; a body whose Content-Length exceeds max_body_bytes gets its 413 from the
    guard, before any of it is forwarded (an app that answers mid-body makes the server reset the
    connection, and the reset can destroy the answer)."""
    from asyncspec.connguard import ConnectionLimits

    head, body = getattr(args, f"{prefix}header_timeout"), getattr(args, f"{prefix}body_timeout")
    per_address = getattr(args, f"{prefix}max_per_address")
    if head <= 0 or body <= 0 or per_address < 1:
        raise InputError("the HTTP header and body timeouts must be positive and the per-address cap at least 1")
    return ConnectionLimits(head, body, per_address, max_body_bytes=max_body_bytes)


def _http_options(parser: argparse.ArgumentParser) -> None:
    from asyncspec.httpguard import DEFAULT_MAX_BODY_BYTES

    parser.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="require `Authorization: Bearer KEY`, KEY a line of FILE (one per client; or env ASYNCSPEC_API_KEY)",
    )
    parser.add_argument("--http-max-body", type=int, default=DEFAULT_MAX_BODY_BYTES, help="request body bytes")
    parser.add_argument("--http-max-connections", type=int, default=64, help="concurrent HTTP requests (503 beyond)")
    add_connection_options(parser, "--http-")
    add_http_auth_options(parser)


def _model_options(parser: argparse.ArgumentParser) -> None:
    add_dtype_option(parser)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
