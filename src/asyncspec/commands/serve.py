"""`asyncspec serve cloud|edge` and `asyncspec client`: the AsymSpec services and their client."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from asyncspec.errors import InputError

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
    cloud.add_argument(
        "--record-traffic", metavar="FILE", help="write every frame received and sent to FILE at exit (bench cloud)"
    )
    _cloud_limits(cloud)
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
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16", "int8", "auto"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")


class StopFlag:
    """Set by SIGTERM / SIGINT; the service loops poll it and return cleanly."""

    def __init__(self):
        self.event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.event.set())

    def __call__(self) -> bool:
        return self.event.is_set()


def _load(name: str, dtype: str, engine: str = "fixed-shape"):
    from asyncspec.models.hf_causal import CausalLMBackend
    from asyncspec.models.registry import load_decoder

    model = load_decoder(name, dtype, engine)
    if not isinstance(model, CausalLMBackend):
        raise InputError(f"{name} is not a causal language model; the AsymSpec services serve text models")
    return model


def _log_exit(role: str, summary: dict) -> None:
    print(f"asyncspec {role} stopped; counters: {json.dumps(summary, default=str)}", file=sys.stderr, flush=True)


def _ready(message: str):
    return lambda: print(message, flush=True)


def run_cloud(args) -> int:
    import zmq

    from asyncspec.cloudedge.auth import require_keys_off_loopback, server_keys
    from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
    from asyncspec.cloudedge.cloud_metrics import serve_cloud_metrics
    from asyncspec.cloudedge.traffic_log import TrafficRecording

    curve = _server_curve(args, server_keys)
    require_keys_off_loopback(args.bind, curve, "--curve-secret", args.allow_insecure)
    attach_metrics = serve_cloud_metrics(args.metrics_port)  # before the model loads: a busy port fails at once
    target = _load(args.model, args.dtype)
    config = CloudConfig(
        max_batch=args.max_batch,
        max_stack=args.max_stack,
        max_queue=args.max_queue,
        batch_wait_s=args.batch_wait_ms / 1000,
        max_block=args.max_block,
        max_requests=args.max_requests,
        max_requests_per_peer=args.max_requests_per_peer,
        max_requests_per_key=args.max_requests_per_key,
        kv_budget_bytes=None if args.kv_budget_mib is None else int(args.kv_budget_mib * (1 << 20)),
        max_message_bytes=args.max_message_bytes,
        decision_cache_bytes=args.reply_cache_bytes,
    )
    cloud = CloudVerifier(target, config)
    attach_metrics(cloud)
    if args.record_traffic:
        cloud.traffic.recording = TrafficRecording()
    stop = StopFlag()
    secured = " (CURVE)" if curve else ""
    ready = f"asyncspec cloud ready on {args.bind}{secured} (model {args.model}; {cloud.batching.line()})"
    try:
        cloud.serve(args.bind, stop, _ready(ready), curve)
    except zmq.ZMQError as error:
        raise InputError(f"cannot bind {args.bind}: {error}") from error
    finally:
        _log_exit("cloud", cloud.summary())
        if cloud.traffic.recording is not None:
            cloud.traffic.recording.save(Path(args.record_traffic))
    return 0


def _policy(args):
    from asyncspec.cloudedge.correction import CorrectionPolicy
    from asyncspec.cloudedge.policy import EdgePolicy

    try:
        schedule = tuple(int(k) for k in args.k_schedule.split(",") if k.strip())
    except ValueError as error:
        raise InputError(f"--k-schedule must be comma-separated integers, not {args.k_schedule!r}") from error
    if list(schedule) != sorted(set(schedule)) or any(k < 1 for k in schedule):
        raise InputError("--k-schedule must be strictly increasing positive integers")
    correction = CorrectionPolicy(k_schedule=schedule, proposals=args.proposals, full_only=args.full_correction)
    policy = EdgePolicy(
        block_size=args.block_size,
        correction=correction,
        uplink=args.uplink,
        pipeline=not args.no_pipeline,
        adaptive_gamma=args.adaptive_gamma,
        dead_after_s=args.dead_after,
        give_up_s=args.give_up,
    )
    if getattr(args, "preset", None):  # a preset overrides the switches above (methods.py)
        from asyncspec.cloudedge.methods import method_policy

        policy = method_policy(args.preset, policy)
    return policy


def _bind_http(args):
    """(socket, guard) for --http, before any model loads: a busy port or bad option fails at once."""
    from asyncspec.httpguard import bind_listening_socket, guard_config

    host, _, port = args.http.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--http must be HOST:PORT, not {args.http!r}")
    guard = guard_config(
        host,
        args.api_key_file,
        args.http_max_body,
        tuple(args.allow_host),
        args.insecure_no_auth,
        args.max_requests_per_api_key,
    )
    connection_limits(args, "http_")  # bad deadlines fail here, before any model loads
    return bind_listening_socket(host, int(port)), guard


def _http_server(gateway, drafter, args, listening, guard):
    from asyncspec.cloudedge.http import ChatFormatter, make_app
    from asyncspec.httpserve import GuardedServer

    app = make_app(gateway, drafter.tokenizer, args.model, ChatFormatter(_hf_tokenizer(args.model)), guard)
    server = GuardedServer(
        app, listening, args.http_max_connections, connection_limits(args, "http_", args.http_max_body)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return server, thread


def _hf_tokenizer(name: str):
    """The model's own tokenizer, for its chat template (None if it has none)."""
    try:
        from transformers import AutoTokenizer

        from asyncspec.models.registry import resolve_source

        return AutoTokenizer.from_pretrained(resolve_source(name)[0])
    except Exception:  # a model without a loadable HF tokenizer: plain transcript chat format
        return None


def run_edge(args) -> int:
    import zmq

    from asyncspec.cloudedge.auth import client_keys, require_keys_off_loopback, server_keys
    from asyncspec.cloudedge.client import ClientFront
    from asyncspec.cloudedge.edge import EdgeGateway

    policy = _policy(args)
    cloud_curve = _edge_curve(args, client_keys)
    front_curve = _server_curve(args, server_keys)
    require_keys_off_loopback(args.bind, front_curve, "--curve-secret", args.allow_insecure)
    http = _bind_http(args) if args.http else None
    drafter = _load(args.model, args.dtype, engine="transformers")  # drafts need not be exact
    gateway = EdgeGateway(drafter, args.cloud, policy, curve=cloud_curve)
    stop = StopFlag()
    try:
        front = ClientFront(args.bind, drafter.tokenizer, curve=front_curve)
    except zmq.ZMQError as error:
        raise InputError(f"cannot bind {args.bind}: {error}") from error
    server, thread = None, None
    try:
        if args.http:
            server, thread = _http_server(gateway, drafter, args, *http)
            _wait_started(server, thread, stop)
        where = f"{args.bind}" + (f", http://{args.http}" if args.http else "")
        ready = _ready(f"asyncspec edge ready on {where} (model {args.model}, cloud {args.cloud})")
        http_dead = (lambda: not thread.is_alive()) if thread is not None else (lambda: False)
        gateway.serve(lambda: stop() or http_dead(), ready, front)
        if http_dead() and not stop():  # the HTTP thread ended on its own: fail loudly, not serve half a service
            raise RuntimeError("the HTTP server thread stopped; the edge is shutting down")
    finally:
        if server is not None:
            server.should_exit = True
        _log_exit("edge", gateway.summary())
    return 0


def _server_curve(args, server_keys):
    """This service's CURVE keys as a server, with the folder of the peers it admits."""
    if args.curve_clients and not args.curve_secret:
        raise InputError("--curve-clients needs --curve-secret (this service's own key pair)")
    return server_keys(args.curve_secret, args.curve_clients) if args.curve_secret else None


def _edge_curve(args, client_keys):
    if bool(args.curve_secret) != bool(args.curve_server):
        raise InputError("CURVE needs both --curve-secret (this edge's) and --curve-server (the cloud's public key)")
    return client_keys(args.curve_secret, args.curve_server) if args.curve_secret else None


def _wait_started(server, thread: threading.Thread, stop) -> None:
    while not server.started and not stop():
        if not thread.is_alive():
            host, port = server.listening.getsockname()[:2]
            raise InputError(f"the HTTP server did not start on {host}:{port}")
        threading.Event().wait(0.05)


def run_client(args) -> int:
    from asyncspec.cloudedge.client import Completion, EdgeClient, EdgeError
    from asyncspec.run.report import write_json

    if not args.prompt.strip():
        raise InputError("the prompt is empty")
    options = dict(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, eps_req=args.eps_req
    )
    from asyncspec.cloudedge.auth import client_keys

    if bool(args.curve_secret) != bool(args.curve_server):
        raise InputError("CURVE needs both --curve-secret (this client's) and --curve-server (the edge's public key)")
    curve = client_keys(args.curve_secret, args.curve_server) if args.curve_secret else None
    with EdgeClient(args.edge, timeout_s=args.timeout, curve=curve) as client:
        try:
            for item in client.stream(args.prompt, **options):
                if isinstance(item, Completion):
                    completion = item
                else:
                    print(item, end="", flush=True)
        except (EdgeError, TimeoutError) as error:
            print(f"asyncspec: error: {error}", file=sys.stderr)
            return 1
    stats = completion.stats
    print()
    print(
        f"[{len(completion.tokens)} tokens, {completion.finish_reason}; TTFT {stats.get('ttft_s') or 0:.3f} s, "
        f"e2e {stats.get('e2e_s') or 0:.3f} s, acceptance {stats.get('acceptance', 0):.2f}, "
        f"uplink {stats.get('uplink_bytes')} B, downlink {stats.get('downlink_bytes')} B]",
        file=sys.stderr,
    )
    if args.json:
        write_json(args.json, completion.__dict__)
    return 0
