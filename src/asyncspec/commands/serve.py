"""`asyncspec serve cloud|edge` and `asyncspec client`: the AsymSpec services and their client."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

from asyncspec.commands.serve_options import connection_limits
from asyncspec.errors import InputError


class StopFlag:
    """Set by SIGTERM / SIGINT; the service loops poll it and return cleanly."""

    def __init__(self):
        self.event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.event.set())

    def __call__(self) -> bool:
        return self.event.is_set()


def load_model(name: str, dtype: str, engine: str = "fixed-shape"):
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
    target = load_model(args.model, args.dtype) if args.replicas is None else None
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
    if args.replicas is not None:
        from asyncspec.commands.serve_replicas import run_replicas

        return run_replicas(args, config, curve, StopFlag)
    cloud = CloudVerifier(target, config)
    attach_metrics(cloud)
    cloud.traffic.recording = TrafficRecording() if args.record_traffic else None
    stop = StopFlag()
    secured = " (CURVE)" if curve else ""
    ready = f"asyncspec cloud ready on {args.bind}{secured} (model {target.describe()}; {cloud.batching.line()})"
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
    drafter = load_model(args.model, args.dtype, engine="transformers")  # drafts need not be exact
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
        ready = _ready(f"asyncspec edge ready on {where} (drafter {drafter.describe()}; cloud {args.cloud})")
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
