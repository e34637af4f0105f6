"""Running the cloud verifier and the edge gateway for tests: in threads of this process (fast,
still over real ZeroMQ sockets on loopback) or as real `asyncspec serve` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud import CloudConfig, CloudVerifier
from asyncspec.cloudedge.edge import EdgeGateway
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import TokenEvent, event_dict
from asyncspec.ports import free_address, free_port  # noqa: F401  (tests import them from here)
from frame_proxy import FrameProxy, FrameProxyConfig

SRC = str(Path(__file__).resolve().parents[1] / "src")


def wait_until(condition, timeout_s: float = 60.0, poll_s: float = 0.05) -> bool:
    """Whether `condition()` holds within timeout_s (polled every poll_s, and once at the end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return bool(condition())


def stop_process(process: subprocess.Popen) -> tuple[int, str]:
    """SIGTERM, then (returncode, stderr); killed if it does not stop within 30 s."""
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, stderr


class ServiceThread:
    """Runs `serve(should_stop, on_ready)` of a service in a daemon thread."""

    def __init__(self, service, *args, **kwargs):
        self.service = service
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None

        def run():
            try:
                service.serve(*args, should_stop=self.stop.is_set, on_ready=self.ready.set, **kwargs)
            except BaseException as error:  # surfaced by the test
                self.error = error
                self.ready.set()

        self.thread = threading.Thread(target=run, daemon=True)

    def start(self) -> ServiceThread:
        self.thread.start()
        assert self.ready.wait(30), "service did not start"
        if self.error:
            raise self.error
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.error:
            raise self.error


@contextmanager
def services(target, drafter, policy: EdgePolicy | None = None, cloud_config: CloudConfig | None = None, link=None):
    """(gateway, cloud, link) with the cloud and edge in threads; `link`: None, a FrameProxyConfig, or a
    (FrameProxyConfig, fault) pair that puts a link emulator between them."""
    cloud_address = free_address()
    cloud = CloudVerifier(target, cloud_config or CloudConfig())
    cloud_thread = ServiceThread(cloud, cloud_address).start()
    proxy = None
    edge_address = cloud_address
    if link is not None:
        config, fault = link if isinstance(link, tuple) else (link, None)
        edge_address = free_address()
        proxy = FrameProxy(edge_address, cloud_address, config or FrameProxyConfig(), fault).__enter__()
    gateway = EdgeGateway(drafter, edge_address, policy)
    edge_thread = ServiceThread(gateway).start()
    try:
        yield gateway, cloud, proxy
    finally:
        edge_thread.close()
        if proxy is not None:
            proxy.__exit__(None, None, None)
        cloud_thread.close()


class Collector:
    """Thread-safe sink for one request's events."""

    def __init__(self):
        self.events: list[dict] = []
        self.done = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event_dict(event))  # as JSON fields, the way a client sees them
        if not isinstance(event, TokenEvent):
            self.done.set()

    @property
    def result(self) -> dict:
        return self.events[-1]


def run_requests(gateway: EdgeGateway, prompts, max_new_tokens, sampling=None, eps_req=0.0, timeout=120):
    """Submit every prompt at once; wait for all; return their final events in order."""
    max_new_tokens = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    samplings = sampling if isinstance(sampling, list) else [sampling or wire.Sampling()] * len(prompts)
    collectors = []
    for prompt, limit, request_sampling in zip(prompts, max_new_tokens, samplings, strict=True):
        collector = Collector()
        gateway.submit(prompt, limit, request_sampling, eps_req, collector)
        collectors.append(collector)
    deadline = time.monotonic() + timeout
    for collector in collectors:
        assert collector.done.wait(max(0.0, deadline - time.monotonic())), "a request hung"
    return [c.result for c in collectors]


def save_tiny(model, directory: Path) -> Path:
    """A tiny test model as a local transformers directory that `--model DIR` loads."""
    import json

    model.model.generation_config.eos_token_id = model.vocab_size - 1
    model.model.save_pretrained(directory)
    model.tokenizer.backend.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "TokenizersBackend", "eos_token": "<eos>", "unk_token": "w0"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def spawn(*args: str, env_extra: dict | None = None) -> subprocess.Popen:
    """`python -m asyncspec ARGS` with this tree's sources; stdout/stderr piped."""
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "asyncspec", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def spawn_cloud_and_edge(target_dir, drafter_dir, *edge_args: str) -> tuple[subprocess.Popen, subprocess.Popen, int]:
    """`serve cloud` and `serve edge --http` on a tiny model pair in fp32 (not yet ready: wait_ready
    each); returns (cloud, edge, the edge's HTTP port)."""
    cloud_address, port = free_address(), free_port()
    cloud = spawn("serve", "cloud", "--model", str(target_dir), "--bind", cloud_address, "--dtype", "fp32")
    edge = spawn(
        "serve", "edge", "--model", str(drafter_dir), "--cloud", cloud_address, "--bind", free_address(),
        "--http", f"127.0.0.1:{port}", "--dtype", "fp32", *edge_args,
    )  # fmt: skip
    return cloud, edge, port


def wait_ready(process: subprocess.Popen, timeout: float = 120) -> str:
    """Read stdout until a line containing 'ready'; returns that line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if "ready" in line:
            return line
        if not line and process.poll() is not None:
            raise AssertionError(f"process exited {process.returncode}: {process.stderr.read()}")
    raise AssertionError("no ready line")


def tiny_qwen3(dtype, seed: int = 0):
    """Like conftest.tiny_causal but a Qwen3: saved to a directory, its word-level tokenizer loads
    back through AutoTokenizer (a saved Qwen2 gets transformers' Qwen2 BPE tokenizer forced on it)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from asyncspec.models.hf_causal import CausalLMBackend
    from conftest import TINY_VOCAB, word_tokenizer

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).to(dtype)
    return CausalLMBackend(model, word_tokenizer(), f"tiny-qwen3-{seed}", frozenset({TINY_VOCAB - 1}))


def model_pair(scale: float = 15.0, noise: float = 0.3, dtype=None, family: str = "qwen2"):
    """(target, drafter): a tiny random Qwen2 whose output head is scaled (peaked, LM-like
    distributions instead of near-uniform ones) and a drafter that is the same model with a
    perturbed head — it agrees often but not always, so every verification path is exercised."""
    import torch

    from conftest import tiny_causal

    dtype = dtype or torch.float32
    build = tiny_causal if family == "qwen2" else tiny_qwen3
    target, drafter = build(dtype, 0), build(dtype, 0)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(scale)
        drafter.model.lm_head.weight.mul_(scale)
        drafter.model.lm_head.weight.add_(noise * torch.randn(drafter.model.lm_head.weight.shape, generator=generator))
    return target, drafter


def decoded(frames):
    """A link record's frames as (direction, message), leaving out those that do not decode."""
    for direction, _, frame in frames:
        try:
            yield direction, wire.decode(frame)
        except wire.ProtocolError:
            continue


def open_block_violations(frames) -> list[str]:
    """From a link record, every moment a request had two open blocks: a Block for a new base
    sent before the previous block's verdict came back, or drafted from a prefix other than the
    one that verdict confirmed (base + accepted + 1)."""
    problems, last = [], {}  # request -> (base, confirmed next base or None)
    for direction, message in decoded(frames):
        if direction == "up" and isinstance(message, wire.Block):
            request, base = message.id.request, message.id.base
            if request in last and last[request][0] != base:
                previous, confirmed = last[request]
                if confirmed is None:
                    problems.append(f"request {request}: block at {base} while block at {previous} was open")
                elif base != confirmed:
                    problems.append(f"request {request}: block at {base}, confirmed prefix ends at {confirmed}")
            if request not in last or last[request][0] != base:
                last[request] = (base, None)
        elif direction == "down" and isinstance(message, wire.Verdict):
            request = message.id.request
            if request in last and last[request][0] == message.id.base:
                last[request] = (message.id.base, message.id.base + message.accepted + 1)
    return problems


def head_agrees_tail_residual(p):  # p: float32 [V] -> q: float32 [V]
    """A draft law that matches p on p's top 8 up to 1 %, puts p's tail (beyond rank 10) at 5 %, and
    gives the freed mass to ranks 9-10: the residual [p - q]+ lies almost entirely in p's tail,
    where a top-8 support does not reach (seed 002 §IV-B2)."""
    import torch

    order = torch.argsort(p, descending=True)
    head, boosted, tail = order[:8], order[8:10], order[10:]
    q = p.clone()
    q[head] *= 0.99
    q[tail] *= 0.05
    q[boosted] += (1 - q.sum()) / 2
    return q


class ShapedDrafter:
    """A real model whose next-token law is reshaped row by row (temperature 1): the edge drafts
    from it and keeps it as Q_i exactly as from any drafter."""

    def __init__(self, base, shape):
        self.base, self.shape = base, shape
        self.name, self.tokenizer, self.eos_ids = f"shaped-{base.name}", base.tokenizer, base.eos_ids
        self.vocab_size, self.max_length = base.vocab_size, base.max_length

    def _logits(self, logits):
        import torch

        rows = [torch.log(self.shape(torch.softmax(row, dim=-1))) for row in logits.reshape(-1, logits.shape[-1])]
        return torch.stack(rows).reshape(logits.shape)

    def prefill(self, request):
        state = self.base.prefill(request)
        state.next_logits = self._logits(state.next_logits)
        return state

    def extend(self, state, tokens):
        logits = self._logits(self.base.extend(state, tokens))
        state.next_logits = logits[-1]
        return logits

    def rollback(self, state, length):
        self.base.rollback(state, length)

    def greedy(self, logits):
        return self.base.greedy(logits)


def invalidated_from_frames(frames, prompts, results) -> int:
    """Blocks the edge sent and dropped, counted from the link record alone (not from its stats):
    each request's decode is replayed from its frames, from its first block along the verdicts
    (the next block used is the one drafted from the prefix a verdict confirmed: base + accepted
    + 1, its root the verdict's token) until its output is complete; every other block sent was
    dropped. Requests are told apart by their Open's prompt (`prompts[i]` gave `results[i]`)."""
    blocks: dict[int, list] = {}  # request -> blocks in the order sent
    verdicts: dict = {}  # block id -> its first greedy verdict
    length: dict[int, int] = {}  # request -> its output's length
    for direction, message in decoded(frames):
        if direction == "up" and isinstance(message, wire.Open):
            prompt = wire.unpack_ids(message.tokens)[: message.prompt_len]
            i = next(i for i, p in enumerate(prompts) if list(p)[: len(prompt)] == prompt)
            length[message.request] = len(results[i]["tokens"])
        elif direction == "up" and isinstance(message, wire.Block):
            sent = blocks.setdefault(message.id.request, [])
            if message not in sent:  # a block resent whole is one block
                sent.append(message)
        elif direction == "down" and isinstance(message, wire.Verdict) and message.token >= 0:
            verdicts.setdefault(message.id, message)
    dropped = 0
    for request, sent in blocks.items():
        used, block, generated = 1, sent[0], 0
        while True:
            verdict = verdicts[block.id]
            generated += verdict.accepted + 1
            if generated >= length[request]:
                break
            base = block.id.base + verdict.accepted + 1
            block = next(b for b in sent if b.id.base == base and b.root == verdict.token)
            used += 1
        dropped += len(sent) - used
    return dropped
