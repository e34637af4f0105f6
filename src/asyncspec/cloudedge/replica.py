"""One verifier replica: a CloudVerifier with its own target and requests (its own KV), run as a
Ray actor by the front (replicas.py). It has no socket: each `step` hands it the frames the front
routed to it since the last step; it handles them and does one turn of work (a batch, an idle
prefill) exactly as `serve cloud` does, and returns the replies for the front to send. This module
needs no Ray: the front wraps the class with `ray.remote`."""

from __future__ import annotations

import os
import secrets
from typing import Any

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud_state import CloudConfig

Routed = tuple[bytes, wire.Message, bytes | None]  # (edge identity, message, its client key)
Reply = tuple[bytes, bytes, wire.Message]  # (edge identity, encoded frame, the message)


class Outbox:
    """The replica's side of the channel: replies wait here until the step returns them."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []

    def send_frame(self, frame: bytes, message: wire.Message, identity: bytes | None = None) -> int:
        self.replies.append((identity, frame, message))
        return len(frame)

    def take(self) -> list[Reply]:
        replies, self.replies = self.replies, []
        return replies


class Replica:
    """A verifier replica: loads `model` itself, verifies with `threads` threads."""

    def __init__(self, model: str, dtype: str, threads: int, config: CloudConfig) -> None:
        import torch

        from asyncspec.cloudedge.cloud import CloudVerifier
        from asyncspec.models.hf_causal import CausalLMBackend
        from asyncspec.models.registry import load_decoder

        torch.set_num_threads(threads)
        target = load_decoder(model, dtype, "fixed-shape")  # as `serve cloud` loads it
        if not isinstance(target, CausalLMBackend):
            raise TypeError(f"{model} is not a causal language model; the cloud verifies text models")
        self.cloud = CloudVerifier(target, config)
        self.outbox = Outbox()
        self.cloud.channel = self.outbox  # type: ignore[assignment]
        # a process Ray restarts after a death says so: it holds none of its predecessor's requests
        self.incarnation = f"{os.getpid()}-{secrets.token_hex(4)}"

    def describe(self) -> dict[str, Any]:
        target = self.cloud.target
        line = self.cloud.batching.line()
        return {
            "pid": os.getpid(),
            "incarnation": self.incarnation,
            "vocab_size": target.vocab_size,
            "max_length": target.max_length,
            "batching": line,
        }

    def step(self, routed: list[Routed], expected: str | None = None) -> dict[str, Any]:
        """Handle the routed frames, do one turn of work; the replies and what the front routes by.
        `expected`: the incarnation the front routed these frames to. Ray may have restarted the
        replica between two steps; then the frames belong to requests it never opened, and it takes
        none of them ("restarted"), so the front counts the death and routes them again."""
        cloud = self.cloud
        if expected is not None and expected != self.incarnation:
            return self._result() | {"restarted": True}
        for identity, message, key in routed:
            cloud.handle(identity, message, key)
        cloud.work()
        return self._result()

    def _result(self) -> dict[str, Any]:
        cloud = self.cloud
        return {
            "replies": self.outbox.take(),
            "free_kv": cloud.quota.kv_budget - cloud.quota.kv_reserved,
            "held": set(cloud.requests) | set(cloud.opening),
            "busy": bool(cloud.queue or cloud.opening),
            "incarnation": self.incarnation,
        }

    def summary(self) -> dict[str, Any]:
        return self.cloud.summary() | {"pid": os.getpid()}
