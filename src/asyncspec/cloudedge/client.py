"""Clients of the edge: the edge's client-facing ROUTER socket (`ClientFront`) and the Python
client (`EdgeClient`) that `asyncspec client` uses."""

from __future__ import annotations

import itertools
import queue
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import zmq

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.auth import start_authenticator
from asyncspec.cloudedge.requests import DoneEvent, EdgeEvent, TokenEvent
from asyncspec.cloudedge.transport import Channel, TrafficCounters, make_socket


class IncrementalText:
    """Detokenise a growing token list, emitting only complete characters."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character split across tokens: wait for the rest
            return ""
        piece, self.sent = text[self.sent :], len(text)
        return piece

    def text(self) -> str:
        return self.tokenizer.decode(self.ids)


MAX_CLIENT_MESSAGE_BYTES = 1 << 20  # a Generate is a prompt and a few numbers
MAX_PER_CLIENT = 16  # requests in flight per client connection
MAX_IN_FLIGHT = 256  # ... and in all: each holds a request at the edge (and its prompt)


class ClientFront:
    """The edge's ZeroMQ front for clients. Its socket is used only in the edge's loop thread;
    prompts are tokenized in a worker thread (a 200,000-character prompt held the loop, and so
    every request's drafting, while it was tokenized), and each client connection may have at
    most `max_per_client` requests in flight (`max_in_flight` in all): beyond, Failed at once."""

    def __init__(
        self,
        address: str,
        tokenizer,
        context: zmq.Context | None = None,
        curve=None,
        max_per_client: int = MAX_PER_CLIENT,
        max_in_flight: int = MAX_IN_FLIGHT,
        executor: Executor | None = None,
    ):
        # with a client allow-list, a ZAP authenticator of its own (one per context) checks every client key
        checked = curve is not None and curve.authorized_dir is not None
        self.own_context = context is None and checked
        self.context = context or (zmq.Context() if self.own_context else zmq.Context.instance())
        self.authenticator = start_authenticator(self.context, curve)  # None without an allow-list
        try:
            socket = make_socket(self.context, zmq.ROUTER, address, True, MAX_CLIENT_MESSAGE_BYTES, curve)
        except zmq.ZMQError:  # a busy address: no authenticator thread left behind
            self._stop_authenticator()
            raise
        self.channel = Channel(socket, TrafficCounters(), self._rejected)
        self.socket = self.channel.socket
        self.tokenizer = tokenizer
        self.max_per_client, self.max_in_flight = max_per_client, max_in_flight
        self.in_flight: Counter[bytes] = Counter()  # loop thread only
        self.refused = 0
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix="asyncspec-tokenize")
        self.failures: queue.SimpleQueue = queue.SimpleQueue()  # (identity, tag, reason) from the worker

    def drain(self, gateway, limit: int = 1000) -> None:
        """Called every loop turn: sends the worker's failures, then reads what clients sent."""
        while not self.failures.empty():
            identity, tag, reason = self.failures.get()
            self._finished(identity)
            self.channel.send(wire.Failed(tag, reason), identity)
        for _ in range(limit):
            if not self.socket.poll(0):
                return
            received = self.channel.receive()
            if received is not None and isinstance(received[1], wire.Generate):
                self._accept(gateway, received[0], received[1])

    def _accept(self, gateway, identity: bytes, message: wire.Generate) -> None:
        if self.in_flight[identity] >= self.max_per_client or self.in_flight.total() >= self.max_in_flight:
            self.refused += 1
            limit = f"{self.max_per_client} per client, {self.max_in_flight} in all"
            self.channel.send(wire.Failed(message.tag, f"too many requests in flight ({limit})"), identity)
            return
        self.in_flight[identity] += 1
        self.executor.submit(self._generate, gateway, identity, message)

    def _finished(self, identity: bytes) -> None:
        self.in_flight[identity] -= 1
        if self.in_flight[identity] <= 0:
            del self.in_flight[identity]

    def _generate(self, gateway, identity: bytes, message: wire.Generate) -> None:
        """In the worker thread: tokenize and submit (thread-safe); the socket is left to the loop."""
        try:
            ids = self.tokenizer.encode(message.prompt)
            sampling = wire.Sampling(wire.f32(message.temperature), message.seed)
            gateway.submit(ids, message.max_new_tokens, sampling, message.eps_req, self._emitter(identity, message))
        except Exception as error:  # bad options or a tokenizer failure: this request fails, the edge goes on
            self.failures.put((identity, message.tag, str(error)))

    def _emitter(self, identity: bytes, message: wire.Generate):
        text = IncrementalText(self.tokenizer)

        def emit(event: EdgeEvent) -> None:  # in the edge's loop thread
            if isinstance(event, TokenEvent):
                piece = text.add(event.token)
                self.channel.send(wire.Token(message.tag, event.token, piece), identity)
                return
            self._finished(identity)
            if isinstance(event, DoneEvent):
                ids = wire.pack_ids(list(event.tokens))
                self.channel.send(wire.Done(message.tag, text.text(), ids, event.finish_reason, event.stats), identity)
            else:
                self.channel.send(wire.Failed(message.tag, event.message), identity)

        return emit

    def _rejected(self, identity: bytes | None, error: wire.ProtocolError) -> None:
        """A Generate whose fields failed their checks gets a Failed reply that says why."""
        if identity is not None and isinstance(error.message, wire.Generate):
            self.channel.send(wire.Failed(error.message.tag, str(error)), identity)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.channel.close()
        self._stop_authenticator()

    def _stop_authenticator(self) -> None:
        if self.authenticator is not None:
            self.authenticator.stop()
        if self.own_context:
            self.context.term()


class EdgeError(RuntimeError):
    """The edge or the cloud could not complete a request."""


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str
    stats: dict = field(default_factory=dict)


class EdgeClient:
    """`with EdgeClient("tcp://127.0.0.1:5556") as c: c.generate("def f(x):", max_new_tokens=32)`."""

    def __init__(self, address: str, timeout_s: float = 600.0, curve=None):
        self.context: zmq.Context = zmq.Context.instance()
        self.channel = Channel(make_socket(self.context, zmq.DEALER, address, False, curve=curve))
        self.timeout_s = timeout_s
        self.tags = itertools.count(1)

    def stream(
        self, prompt: str, max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0, eps_req: float = 0.0
    ) -> Iterator[str | Completion]:
        """Yields text pieces as tokens are committed, then the Completion."""
        tag = next(self.tags)
        self.channel.send(wire.Generate(tag, prompt, max_new_tokens, float(temperature), seed, float(eps_req)))
        deadline = time.monotonic() + self.timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.channel.socket.poll(int(remaining * 1000)):
                raise TimeoutError(f"no answer from the edge within {self.timeout_s:.0f} s")
            received = self.channel.receive()
            if received is None or getattr(received[1], "tag", None) != tag:
                continue
            message = received[1]
            if isinstance(message, wire.Token):
                deadline = time.monotonic() + self.timeout_s
                yield message.text
            elif isinstance(message, wire.Done):
                yield Completion(message.text, wire.unpack_ids(message.tokens), message.finish_reason, message.stats)
                return
            elif isinstance(message, wire.Failed):
                raise EdgeError(message.message)

    def generate(self, prompt: str, **options) -> Completion:
        for item in self.stream(prompt, **options):
            if isinstance(item, Completion):
                return item
        raise EdgeError("the stream ended without a result")

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> EdgeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
