"""Arguments of `asyncspec bench cloudedge` and `asyncspec bench correction` (their runs live in
benchmarks/cloudedge.py and benchmarks/correction_sensitivity.py)."""

from __future__ import annotations

# the method names of asyncspec.cloudedge.methods, repeated so that building the parser imports no torch
# (`asyncspec link` shares this parser and must start fast)
METHOD_NAMES = (
    "asymspec,standard,runahead,cosine,no-asym-topk,no-topk,no-pipeline,no-pipeline-runahead,asymspec-adaptive"
)


CLOUDEDGE_HELP = "AsymSpec vs baselines and ablations over emulated weak/medium/strong links"
CORRECTION_HELP = "correction sensitivity: residual TV / recall vs K, task quality"


def add_cloudedge_arguments(bench) -> None:
    bench.add_argument("--models", choices=["tiny", "qwen"], help="default: qwen when prepared, else tiny")
    bench.add_argument("--methods", default="all", help=f"comma-separated, or all: {METHOD_NAMES}")
    bench.add_argument("--profiles", default="weak,medium,strong")
    bench.add_argument("--link-scales", help="comma-separated link scales (default: 1 and DEFAULT_LINK_SCALE=40)")
    bench.add_argument(
        "--workload", choices=["mixed", "humaneval", "gsm8k"], help="qwen prompts (default: mixed, both alternating)"
    )
    bench.add_argument("--requests", type=int, help="requests per run, seed SEED+i each (default: tiny 6, qwen 6)")
    bench.add_argument("--max-new-tokens", type=int, help="per request (default: tiny 24, qwen 16)")
    bench.add_argument("--clients", type=int, help="closed loop: concurrent clients (default: all requests at once)")
    bench.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second (instead of --clients)")
    bench.add_argument("--temperature", type=float, help="0 = greedy (then every output is checked); default 0.7")
    bench.add_argument("--temperatures", help="comma-separated, every run at each (e.g. 0.7,0: greedy beside sampled)")
    bench.add_argument("--eps-req", type=float, default=0.0, help="per-request TV budget (0: every correction exact)")
    bench.add_argument("--block-size", type=int, default=7, help="candidates per block (gamma)")
    bench.add_argument("--run-timeout", type=float, help="seconds per run; a run cut short counts what it committed")
    bench.add_argument("--check-requests", type=int, help="greedy exactness check: requests per method (0: none)")
    bench.add_argument("--check-tokens", type=int, help="greedy exactness check: tokens per request")
    bench.add_argument("--dtype", choices=["bf16", "fp32", "int8"], help="default: tiny fp32, qwen the fastest here")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--record-traffic", metavar="FILE", help="the cloud's frames, for `bench cloud` to replay")
    bench.add_argument("--out", default="out", help="folder for the JSON and PNGs")
    bench.add_argument("--json", metavar="FILE", help="JSON path (default: OUT/cloudedge.json)")


def add_correction_arguments(correction) -> None:
    correction.add_argument("--models", choices=["tiny", "qwen"], help="default: qwen when prepared, else tiny")
    correction.add_argument("--positions", type=int, default=48, help="rejection positions for the fidelity sweep")
    correction.add_argument("--ks", default="5,8,16,32,64,128,256,512,1024,2048,4096,8192")
    correction.add_argument("--temperature", type=float, default=0.7)
    correction.add_argument("--quality-problems", type=int, default=2, help="per workload (0: skip task quality)")
    correction.add_argument("--quality-tokens", type=int, default=96, help="max new tokens per quality problem")
    correction.add_argument("--quality-k", type=int, default=16, help="bounded support K for the quality runs")
    correction.add_argument("--eps-req", type=float, default=0.05, help="TV budget of the bounded quality runs")
    correction.add_argument(
        "--unsafe-local-exec",
        action="store_true",
        help="score HumanEval even where the sandbox gets no namespaces (model-written code then runs as this user)",
    )
    correction.add_argument("--dtype", choices=["bf16", "fp32", "int8"])
    correction.add_argument("--seed", type=int, default=0)
    correction.add_argument("--out", default="out")
    correction.add_argument("--json", metavar="FILE", help="JSON path (default: OUT/correction.json)")


CLOUD_HELP = "the cloud verifier alone, replaying recorded edge traffic from M concurrent sessions"


def add_cloud_arguments(bench) -> None:
    bench.add_argument("--traffic", required=True, help="a recording from `serve cloud --record-traffic`")
    bench.add_argument("--model", required=True, help="the target the traffic was recorded against")
    bench.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32", "int8"], help="as it was recorded")
    bench.add_argument("--concurrency", type=int, default=4, help="sessions in flight at once")
    bench.add_argument(
        "--variant", action="append", metavar="NAME=ARGS",
        help="a cloud to measure: NAME and its extra `serve cloud` arguments (repeatable; default: one, as is)",
    )  # fmt: skip
    bench.add_argument(
        "--replicas", metavar="N,N", help="also a variant per replica count: `serve cloud --replicas N` on Ray"
    )
    bench.add_argument("--timeout", type=float, default=600.0, help="seconds per variant")
    bench.add_argument("--out", default="out")
    bench.add_argument("--json", metavar="FILE", help="JSON path (default: OUT/bench_cloud.json)")
