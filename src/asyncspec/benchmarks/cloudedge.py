"""`asyncspec bench cloudedge`: every method (AsymSpec, its baselines and ablations) under every network
profile, unscaled and with the link scaled, on the same cloud process, link emulator and models, in one
invocation so the ratios share machine conditions.

Per (link scale, profile, method): a fresh `LinkProcess` before the one cloud process and a fresh edge
process with the method's preset. Bytes per token are the wire bytes the link carried (framing, pings).

Workload: `--requests N` prompts drawn from HumanEval and GSM8K (`--workload mixed`, the default: the
shortest prompts of each, alternating, so that a 1.5B prefill on one core does not dominate the few
tokens a run can afford) or from one of them. Request i carries seed `--seed` + i under every method and
temperature, so every method samples from the same seeds. `--temperatures 0.7,0` runs every method at
each temperature (greedy runs beside sampled ones); figures come with 95 % intervals over requests
(cloudedge_metrics), compared in cloudedge_report.

Exactness: every (method, scale, profile, temperature) run is checked against target-only decoding of
the same prompts on full-length outputs: greedy runs directly, sampled runs by greedy check requests
sent through the same edge and link profile right after the measured run (unless a greedy run of the
same method, scale and profile is in the grid: it is the check). A mismatch, or a run that could not be
checked in full (timed out), fails the command; a mismatched run is left out of every figure.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from asyncspec.benchmarks import cloudedge_metrics as run_figures
from asyncspec.benchmarks import cloudedge_report as report
from asyncspec.benchmarks.cloudedge_driver import (
    EdgeProcess,
    Workload,
    free_port,
    run_profile,
    spawn_service,
    stop_service,
)
from asyncspec.cloudedge.link.profiles import DEFAULT_LINK_SCALE, resolve_profile
from asyncspec.cloudedge.methods import COSINE_NOTE
from asyncspec.errors import InputError
from asyncspec.exactness import ExactnessCheck

QWEN_PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
BYTES_SOURCE = "LinkProcess wire bytes per direction (ZeroMQ framing and pings included) / committed tokens"
INTERVALS_NOTE = (
    "95 % Student-t confidence intervals of the mean over a run's requests; throughput's interval is requests x "
    "the mean per-request rate (a request's tokens / time from its send to its last token); two methods whose "
    "intervals overlap are not separable"
)


@dataclass
class BenchConfig:
    models: str  # "tiny" | "qwen"
    methods: list[str]
    profiles: list[str]
    scales: list[float]
    workload: str  # "mixed" (HumanEval and GSM8K), "humaneval" or "gsm8k"
    requests: int
    max_new_tokens: int
    temperatures: list[float]
    eps_req: float
    clients: int | None
    rate_per_s: float | None
    block_size: int
    run_timeout_s: float
    check_requests: int
    check_tokens: int
    dtype: str
    seed: int


WORKLOADS = ("mixed", "humaneval", "gsm8k")
GSM8K_FORMAT = "plain"  # `Question: ...\nAnswer:`: no chat turns, so the prefill stays short


def prompts_for(config: BenchConfig) -> list[str]:
    count = max(config.requests, config.check_requests)
    if config.models == "tiny":
        from asyncspec.benchmarks.tiny_pair import tiny_prompts

        return tiny_prompts(count, config.seed)
    from asyncspec.data.workloads.tasks import load_tasks

    # the shortest prompts of each workload: on two CPU cores a 1.5B prefill of a long prompt costs tens of
    # seconds and would dominate the few tokens a run can afford, hiding the decoding methods' differences
    names = ["humaneval", "gsm8k"] if config.workload == "mixed" else [config.workload]
    pools = [sorted((t.prompt for t in load_tasks(name, gsm8k_format=GSM8K_FORMAT)), key=len) for name in names]
    return [pools[i % len(pools)][i // len(pools)] for i in range(count)]


def prompt_sources(config: BenchConfig) -> list[str]:
    """The workload each request's prompt came from (request i has seed config.seed + i)."""
    if config.models == "tiny":
        return ["tiny"] * config.requests
    names = ["humaneval", "gsm8k"] if config.workload == "mixed" else [config.workload]
    return [names[i % len(names)] for i in range(config.requests)]


def model_paths(config: BenchConfig, scratch: Path) -> tuple[str, str]:
    if config.models == "tiny":
        from asyncspec.benchmarks.tiny_pair import save_tiny_pair

        target, drafter = save_tiny_pair(scratch)
        return str(target), str(drafter)
    return QWEN_PAIR


def edge_args(config: BenchConfig, drafter: str, method: str) -> list[str]:
    return [
        "--model", drafter, "--dtype", config.dtype, "--threads", "1", "--preset", method,
        "--block-size", str(config.block_size), "--dead-after", "120", "--give-up", "900",
    ]  # fmt: skip


def run(args) -> int:
    config = config_from_args(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="asyncspec-bench-models-") as scratch:
        target, drafter = model_paths(config, Path(scratch))
        prompts = prompts_for(config)
        cloud, cloud_port = _spawn_cloud(config, target, args.record_traffic, Path(scratch))
        try:
            results = measure(config, cloud_port, drafter, prompts, Path(scratch), out / "cloudedge.partial.json")
        finally:
            stop_service(cloud)
        exactness = check_exactness(config, target, prompts, results)
    kept = [r for r in results if r["exact"] is not False]  # a mismatched run is never part of a figure
    summary = report.comparisons(kept)
    tables = report.table_ii(kept)
    print(report.format_all(kept, summary, tables))
    for result in results:
        if result["exact"] is False:
            print(f"left out of every figure (output differs from target-only): {run_name(result)}")
    exit_code = exactness.report()
    load = os.getloadavg()
    machine = f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end"
    print(f"machine: {machine}; models {target} <- {drafter} ({config.dtype}); {time.time() - started:.0f} s")
    document: dict[str, Any] = {
        "config": asdict(config),
        "models": {
            "target": target if config.models != "tiny" else "tiny",
            "drafter": drafter if config.models != "tiny" else "tiny",
        },
        "machine": machine,
        "bytes_per_token_source": BYTES_SOURCE,
        "intervals": INTERVALS_NOTE,
        "requests": [
            {"index": i, "workload": w, "seed": config.seed + i, "prompt": p}
            for i, (w, p) in enumerate(zip(prompt_sources(config), prompts, strict=False))
        ],
        "cosine": COSINE_NOTE,
        "results": results,
        "comparisons": summary,
        "table_ii": tables,
        "exactness": exactness.as_json() | check_size(config),
        "plots": [str(p) for p in report.plot(kept, out)],
    }
    json_path = Path(args.json) if args.json else out / "cloudedge.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=1, default=str))
    print(f"wrote {json_path} and {', '.join(document['plots'])}")
    return exit_code


def measure(
    config: BenchConfig, cloud_port: int, drafter: str, prompts: list[str], scratch: Path, partial: Path
) -> list[dict]:
    """Every (method, temperature, scale, profile) run; each result is also appended to `partial` as it comes."""
    results: list[dict] = []
    for method in config.methods:
        with EdgeProcess(edge_args(config, drafter, method), free_port(), scratch) as edge:
            for temperature in config.temperatures:
                workload = Workload(
                    prompts[: config.requests], config.requests, config.max_new_tokens, temperature,
                    config.eps_req, config.seed, config.clients, config.rate_per_s,
                )  # fmt: skip
                for scale in config.scales:
                    for name in config.profiles:
                        if edge.cold:  # new, or restarted after a run that timed out
                            warm_up(edge, cloud_port, workload, config.run_timeout_s, every_prompt=not results)
                        profile = resolve_profile(name, scale=scale)
                        output = run_profile(edge, profile, cloud_port, workload, config.run_timeout_s)
                        metrics = run_figures.run_metrics(output)
                        metrics["outputs"] = outputs_of(output)
                        if needs_greedy_check(config, temperature):  # checked through greedy requests
                            metrics["check_outputs"] = greedy_check(edge, profile, cloud_port, config, prompts)
                        result = {"profile": name, "link_scale": scale, "method": method, "temperature": temperature}
                        results.append({**result, **metrics})
                        print(_progress(scale, name, method, temperature, metrics), flush=True)
                        partial.write_text(json.dumps({"config": asdict(config), "results": results}, default=str))
    grid = [(t, s, p) for t in config.temperatures for s in config.scales for p in config.profiles]
    order = {key: i for i, key in enumerate(grid)}
    return sorted(results, key=lambda r: order[(r["temperature"], r["link_scale"], r["profile"])])


def needs_greedy_check(config: BenchConfig, temperature: float) -> bool:
    """A sampled run is vouched for by greedy check requests, unless the grid runs greedy itself."""
    return temperature > 0 and 0 not in config.temperatures


def warm_up(edge: EdgeProcess, cloud_port: int, workload: Workload, timeout_s: float, every_prompt=False) -> None:
    """One short unreported request through a fresh or restarted edge before its next measured run: a
    process's first forwards (allocations, kernel set-up) cost seconds, which would otherwise land on the
    run after each start and bias the comparison between profiles. Before the invocation's first run,
    `every_prompt`: every prompt of the workload at once, so that the cloud's first prefills of these
    prompts' shapes and its first multi-request batches fall on no method's measured run (the first
    method's TTFT was 2-3x the second's on the Qwen pair without it)."""
    count = workload.requests if every_prompt else 1
    short = replace(
        workload, prompts=workload.prompts[:count], requests=count, max_new_tokens=min(8, workload.max_new_tokens)
    )
    if not run_profile(edge, resolve_profile("strong"), cloud_port, short, timeout_s).timed_out:
        edge.cold = False  # a warm-up that timed out restarted the edge: still cold


def _progress(scale: float, profile: str, method: str, temperature: float, metrics: dict) -> str:
    return (
        f"  scale {scale:g} T {temperature:g} {profile:<6} {method:<21} {metrics['throughput_tok_s']:7.3f} tok/s "
        f"({metrics['committed_tokens']} tokens, {metrics['completed']}/{metrics['requests']} done"
        f"{', TIMED OUT' if metrics['timed_out'] else ''})"
    )


def outputs_of(output) -> list[dict]:
    """Each request's prompt and tokens, and whether it finished (a cut output cannot be checked)."""
    return [
        {"prompt": r.prompt, "tokens": r.tokens, "complete": r.done is not None and r.error is None}
        for r in output.records
    ]


def greedy_check(edge: EdgeProcess, profile, cloud_port: int, config: BenchConfig, prompts: list[str]) -> list[dict]:
    """The greedy check requests through the same edge and link profile as the run they vouch for."""
    count = config.check_requests
    workload = Workload(prompts[:count], count, config.check_tokens, 0.0, 0.0, config.seed)
    return outputs_of(run_profile(edge, profile, cloud_port, workload, 20 * config.run_timeout_s))


def check_size(config: BenchConfig, temperature: float | None = None) -> dict:
    """(requests, tokens) a run's exactness is checked on: the runs themselves when greedy (and, when
    the grid runs greedy, the sampled runs are vouched for by those)."""
    if temperature is None:
        return {f"T {t:g}": check_size(config, t) for t in config.temperatures}
    if temperature <= 0 or not needs_greedy_check(config, temperature):
        return {"requests": config.requests, "max_new_tokens": config.max_new_tokens}
    return {"requests": config.check_requests, "max_new_tokens": config.check_tokens}


def _spawn_cloud(config, target: str, record: str | None, scratch: Path):
    """`serve cloud` for the runs on a free port, and the port; with `record`, it records its traffic there."""
    port = free_port()
    extra = ["--record-traffic", str(Path(record).resolve())] if record else []
    args = ["serve", "cloud", "--model", target, "--dtype", config.dtype, "--threads", "1", *extra]
    return spawn_service([*args, "--bind", f"tcp://127.0.0.1:{port}"], scratch / "cloud.log"), port


def run_name(result: dict) -> str:
    at = f" at T {result['temperature']:g}" if "temperature" in result else ""
    return f"{result['method']} under {result['profile']} at link scale {result['link_scale']:g}{at}"


def check_exactness(config: BenchConfig, target: str, prompts: list[str], results: list[dict]) -> ExactnessCheck:
    """Every run's full-length outputs against target-only decoding in this process; sets each
    result's `exact` (True, False, or None when it could not be checked in full)."""
    import torch

    from asyncspec.decoding.target_only import decode_target_only
    from asyncspec.models.hf_causal import CausalLMBackend
    from asyncspec.models.registry import load_decoder

    torch.set_num_threads(1)
    model = cast(CausalLMBackend, load_decoder(target, config.dtype))  # the pair's target is a causal LM
    exactness = ExactnessCheck(model)
    references: dict[tuple[int, int], tuple[dict, dict]] = {}
    for result in results:
        temperature = result["temperature"]
        if temperature > 0 and not needs_greedy_check(config, temperature):
            result["exact"] = None  # vouched for by the greedy run of the same method, scale and profile
            continue
        size = check_size(config, temperature)
        shape = (size["requests"], size["max_new_tokens"])
        if shape not in references:  # target-only once per (requests, tokens)
            requests = {p: model.request(p, max_new_tokens=shape[1]) for p in prompts[: shape[0]]}
            references[shape] = (requests, {p: decode_target_only(model, None, r).tokens for p, r in requests.items()})
        requests, expected = references[shape]
        outputs = result["outputs"] if temperature <= 0 else result["check_outputs"]
        result["exact"] = check_run(exactness, result, outputs, requests, expected, shape[0])
    _vouch_for_sampled_runs(results)
    return exactness


def _vouch_for_sampled_runs(results: list[dict]) -> None:
    """A sampled run shares the verdict of the greedy run of its method, scale and profile."""
    greedy = {(r["method"], r["link_scale"], r["profile"]): r["exact"] for r in results if r["temperature"] <= 0}
    for result in results:
        if result["temperature"] > 0 and "check_outputs" not in result:
            result["exact"] = greedy.get((result["method"], result["link_scale"], result["profile"]))


def check_run(exactness: ExactnessCheck, result: dict, outputs, requests, expected, count: int) -> bool | None:
    before = exactness.mismatch_count
    complete = [(i, o) for i, o in enumerate(outputs) if o["complete"]]
    for index, output in complete:
        where = f"request {index} under {result['profile']} at link scale {result['link_scale']:g}"
        prompt = output["prompt"]
        exactness.check(where, result["method"], requests[prompt], expected[prompt], output["tokens"])
    if len(complete) < count:
        exactness.not_checked(f"{run_name(result)}: {count - len(complete)} of {count} requests did not finish")
    if exactness.mismatch_count > before:
        return False
    return True if len(complete) == count else None


def config_from_args(args) -> BenchConfig:
    from asyncspec.cloudedge.methods import parse_methods
    from asyncspec.models.registry import concrete_dtype

    models = args.models or ("qwen" if _qwen_prepared() else "tiny")
    if models == "qwen" and not _qwen_prepared():
        raise InputError("the Qwen2.5-Coder pair is not prepared; run `asyncspec models prepare` or use --models tiny")
    defaults = TINY_DEFAULTS if models == "tiny" else QWEN_DEFAULTS
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    for profile in profiles:
        resolve_profile(profile)
    scales = [float(s) for s in args.link_scales.split(",")] if args.link_scales else [1.0, DEFAULT_LINK_SCALE]
    if any(s <= 0 for s in scales):
        raise InputError("link scales must be positive")

    def pick(name: str) -> Any:  # the option as given, else the model pair's default
        value = getattr(args, name)
        return defaults[name] if value is None else value

    config = BenchConfig(
        models=models,
        methods=parse_methods(args.methods),
        profiles=profiles,
        scales=scales,
        workload=args.workload or ("mixed" if models == "qwen" else "humaneval"),
        requests=pick("requests"),
        max_new_tokens=pick("max_new_tokens"),
        temperatures=_temperatures(args),
        eps_req=args.eps_req,
        clients=args.clients,
        rate_per_s=args.rate,
        block_size=args.block_size,
        run_timeout_s=pick("run_timeout"),
        check_requests=pick("check_requests"),
        check_tokens=pick("check_tokens"),
        # one concrete precision for the services and the references: "auto" is measured per thread count
        dtype=args.dtype or ("fp32" if models == "tiny" else concrete_dtype(QWEN_PAIR[0], "auto")),
        seed=args.seed,
    )
    if config.requests < 1 or config.max_new_tokens < 1 or config.run_timeout_s <= 0:
        raise InputError("--requests, --max-new-tokens and --run-timeout must be positive")
    if any(t < 0 for t in config.temperatures) or config.eps_req < 0:
        raise InputError("--temperature(s) and --eps-req must be >= 0")
    sampled = [t for t in config.temperatures if needs_greedy_check(config, t)]
    if sampled and (config.check_requests < 1 or config.check_tokens < 1):
        raise InputError(
            "sampled runs are checked by greedy requests (or add 0 to --temperatures): "
            "--check-requests and --check-tokens must be >= 1"
        )
    return config


def _temperatures(args) -> list[float]:
    """--temperatures T1,T2 (each run at every one), or the single --temperature (default 0.7)."""
    text = getattr(args, "temperatures", None)
    if not text:
        return [args.temperature if args.temperature is not None else 0.7]
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError as error:
        raise InputError(f"--temperatures must be comma-separated numbers, not {text!r}") from error
    if not values or len(set(values)) != len(values):
        raise InputError("--temperatures needs distinct values")
    return values


# Quick defaults: tiny models finish the whole grid in about a minute; the real pair's defaults are sized
# for minutes (1.5B verification costs ~0.75 s per width-1 and 2+ s per width-8 forward on one core).
TINY_DEFAULTS = dict(requests=6, max_new_tokens=24, run_timeout=60.0, check_requests=4, check_tokens=24)
QWEN_DEFAULTS = dict(requests=6, max_new_tokens=16, run_timeout=60.0, check_requests=2, check_tokens=12)


def _qwen_prepared() -> bool:
    from asyncspec.models.offline import is_prepared

    try:
        return all(is_prepared(name) for name in QWEN_PAIR)
    except Exception:  # an unknown registry state: treat as not prepared
        return False
