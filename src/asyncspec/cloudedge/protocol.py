"""Messages between the edge gateway and the cloud verifier, and their msgpack codec.

A frame is a msgpack array `[code, field, ...]` in the dataclass's field order; never pickle.
Token ids travel as unsigned LEB128 varints (`pack_ids`) and probabilities as little-endian float32
bytes: the exact float32 value the sender used for sampling arrives bit for bit (seed 002 §IV-B1).
Trailing fields left at their defaults are not sent (`encode`), since `decode` fills them in.

Every block-level message carries a `BlockId` that binds it to the request, the base-prefix
version (confirmed length, prompt included), the number of candidate positions and a digest of
the sampling configuration, so late, duplicated or stale messages are recognised.
Decoding validates shape and types; anything else raises `ProtocolError` (the caller drops and
counts the frame, it never crashes a service).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import MISSING, dataclass, fields
from typing import ClassVar

import msgpack

from asyncspec.cloudedge import framing
from asyncspec.cloudedge.framing import unpack_bounded
from asyncspec.cloudedge.wire_arrays import (  # noqa: F401  (the protocol's array codec and error)
    ProtocolError,
    f32,
    id_array,
    id_count,
    pack_ids,
    pack_probs,
    unpack_ids,
    unpack_probs,
)
from asyncspec.shaping import Shaping

# ---------------------------------------------------------------- identity and configuration


@dataclass(frozen=True)
class Sampling:
    """What decides the target's law: temperature (float32; 0 = greedy), the request's seed, and
    OpenAI's shaping fields (float32; shaping.py): top_p and the presence and frequency penalties."""

    temperature: float = 0.0
    seed: int = 0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def shaping(self) -> Shaping:
        return Shaping(self.top_p, self.presence_penalty, self.frequency_penalty)

    def digest(self) -> int:
        shaping = (self.top_p, self.presence_penalty, self.frequency_penalty)
        return zlib.crc32(struct.pack("<fQfff", self.temperature, self.seed, *shaping))  # seeds are unsigned 64-bit


@dataclass(frozen=True)
class BlockId:
    request: int  # request id, unique per edge request
    base: int  # confirmed length (prompt + generated) the block was drafted from
    n: int  # candidate positions base .. base + n - 1 (after the root)
    config: int  # Sampling.digest() of the request

    def key(self) -> tuple[int, int]:
        return (self.request, self.base)


# ---------------------------------------------------------------- messages


class Message:
    code: ClassVar[int]


@dataclass(frozen=True)
class Open(Message):
    """edge -> cloud: start (or resynchronise) a request; the cloud prefills `tokens`
    (prompt + confirmed output, all but the last confirmed token, which comes as a block's root)."""

    code: ClassVar[int] = 1
    request: int
    tokens: bytes  # varint ids
    prompt_len: int
    temperature: float
    seed: int
    first_k: int  # top-K support size to return with a rejection verdict (0: none)
    epoch: int  # resynchronisations so far: a late duplicate Open (lower epoch) is ignored
    # exact-recovery proposals a rejecting verdict carries (0: none; the edge queries for them), and
    # with them the cloud settles a rejection itself wherever it can decide the recovery exactly
    first_proposals: int = 0
    top_p: float = 1.0  # shaping of the target's law (shaping.py), float32
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int = -1  # verdicts carry log-probabilities with this many alternatives (-1: none)

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.seed, self.top_p, self.presence_penalty, self.frequency_penalty)


@dataclass(frozen=True)
class Block(Message):
    """edge -> cloud: verify `root` + candidates. Uplink per candidate: id + q(id) only."""

    code: ClassVar[int] = 2
    id: BlockId
    root: int  # last confirmed token, not yet in the cloud's KV
    candidates: bytes  # varint ids [n]
    q: bytes  # float32 [n] draft probability of each candidate (empty when greedy)
    q_full: bytes = b""  # float32 [n, V] (baseline with full-distribution uplink only)


@dataclass(frozen=True)
class Verdict(Message):
    """cloud -> edge: `accepted` leading candidates, then either the cloud's own token (greedy, bonus
    after full acceptance, or a rejection the cloud settled itself: `settled_by`) or, after a sampled
    rejection left open, a first top-K support and the first round of exact-recovery proposals."""

    code: ClassVar[int] = 3
    id: BlockId
    accepted: int
    token: int  # next token, or -1 while the correction at position `accepted` is open
    support_ids: bytes = b""  # varint ids [K] target top-K at the rejected position, by descending p
    support_p: bytes = b""  # float32 [K] their target probabilities
    tail: float = 0.0  # float32: target mass outside the support (delta_p)
    # "" (no rejection settled here), "recovery" (the cloud decided exact recovery from q(rejected) and
    # the bound q(v) <= 1 - q(rejected)), "residual" (full-uplink baselines: drawn from [p - q]+)
    settled_by: str = ""
    proposal_ids: bytes = b""  # varint ids [N] exact-recovery proposals v ~ p (round 0), token == -1 only
    proposal_p: bytes = b""  # float32 [N] p(v)
    proposal_u: bytes = b""  # float32 [N] the uniforms the cloud decided with: the edge must use them
    # only when the Open asked (logprobs.py): float32 log-probabilities of the decided tokens, and
    # each row's alternatives up to the first not accepted (varint ids, float32 values)
    logprobs: bytes = b""
    top_ids: bytes = b""
    top_logprobs: bytes = b""


@dataclass(frozen=True)
class CorrectionQuery(Message):
    """edge -> cloud: more of the open correction: top-K entries [start, stop), `count` exact-recovery
    proposals (round `start`), or the full distribution."""

    code: ClassVar[int] = 4
    id: BlockId
    kind: str  # "topk" | "proposals" | "full"
    start: int = 0
    stop: int = 0


@dataclass(frozen=True)
class Correction(Message):
    """cloud -> edge: the answer to a CorrectionQuery (same kind and range)."""

    code: ClassVar[int] = 5
    id: BlockId
    kind: str
    start: int
    ids: bytes  # varint ids: support entries, proposals, or empty for "full"
    p: bytes  # float32: their target probabilities, or the whole p [V] for "full"
    tail: float = 0.0  # float32: target mass outside the support so far ("topk")


@dataclass(frozen=True)
class Close(Message):
    """edge -> cloud: the request finished or was abandoned; free its state."""

    code: ClassVar[int] = 6
    request: int


@dataclass(frozen=True)
class Ping(Message):
    code: ClassVar[int] = 7
    sent: float


@dataclass(frozen=True)
class Pong(Message):
    """cloud -> edge: liveness; `instance` changes when the cloud restarts."""

    code: ClassVar[int] = 8
    sent: float
    instance: int
    vocab_size: int
    max_length: int
    queued: int


@dataclass(frozen=True)
class Nack(Message):
    """cloud -> edge: a block or query the cloud will not process, and why."""

    code: ClassVar[int] = 9
    request: int
    base: int
    # "unknown" (resend Open), "stale", "busy" (back-pressure: retry), "invalid", "full" (the cloud
    # holds its limit of open requests: this request is refused)
    reason: str
    detail: str = ""  # for "invalid" and "full": what was wrong, in words


# ---------------------------------------------------------------- client <-> edge


@dataclass(frozen=True)
class Generate(Message):
    """client -> edge: a raw text prompt, continued as `asyncspec generate --prompt` would."""

    code: ClassVar[int] = 20
    tag: int  # the client's id for this request
    prompt: str
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    eps_req: float = 0.0


@dataclass(frozen=True)
class Token(Message):
    """edge -> client: one committed token and the text it completes (may be empty mid-character)."""

    code: ClassVar[int] = 21
    tag: int
    token: int
    text: str


@dataclass(frozen=True)
class Done(Message):
    code: ClassVar[int] = 22
    tag: int
    text: str
    tokens: bytes  # varint ids
    finish_reason: str  # "eos" | "length"
    stats: dict


@dataclass(frozen=True)
class Failed(Message):
    code: ClassVar[int] = 23
    tag: int
    message: str


MESSAGES: dict[int, type[Message]] = {
    m.code: m
    for m in (Open, Block, Verdict, CorrectionQuery, Correction, Close, Ping, Pong, Nack, Generate, Token, Done, Failed)
}
NACK_REASONS = frozenset({"unknown", "stale", "busy", "invalid", "full"})
CORRECTION_KINDS = frozenset({"topk", "proposals", "full"})
SETTLED_BY = frozenset({"", "recovery", "residual"})
_WIRE_TYPES = {
    "int": (int,),
    "float": (float, int),
    "bytes": (bytes,),
    "str": (str,),
    "dict": (dict,),
}  # annotations are strings


def encode(message: Message) -> bytes:
    body: list = [message.code]
    specs = fields(message)  # type: ignore[arg-type]  # every Message is a dataclass
    for field in specs:
        value = getattr(message, field.name)
        body.append([value.request, value.base, value.n, value.config] if isinstance(value, BlockId) else value)
    while len(body) > 1 and _is_default(specs[len(body) - 2], body[-1]):
        body.pop()  # the uplink pays for every byte: a Block's empty q_full was 2 of them
    return msgpack.packb(body, use_bin_type=True)


def _is_default(spec, value) -> bool:
    return spec.default is not MISSING and type(value) is type(spec.default) and value == spec.default


def decode(frame: bytes) -> Message:
    try:
        body = unpack_bounded(frame)
    except Exception as error:  # msgpack raises several types for garbage
        raise ProtocolError(f"not msgpack: {error}") from error
    if not isinstance(body, list) or not body or not _is_int(body[0]) or body[0] not in MESSAGES:
        raise ProtocolError("not a message of this protocol")
    cls = MESSAGES[body[0]]
    specs = fields(cls)  # type: ignore[arg-type]  # every Message is a dataclass
    values = body[1:]
    required = sum(1 for f in specs if f.default is MISSING)
    if not required <= len(values) <= len(specs):
        raise ProtocolError(f"{cls.__name__}: {len(values)} fields")
    kwargs = {spec.name: _check(cls, spec, value) for spec, value in zip(specs, values, strict=False)}
    message = cls(**kwargs)
    _validate(message)
    return message


def _check(cls, spec, value):
    if spec.type == "BlockId":
        if not (isinstance(value, list) and len(value) == 4 and all(_is_int(v) for v in value)):
            raise ProtocolError(f"{cls.__name__}.{spec.name}: bad block id")
        return BlockId(*value)
    wanted = _WIRE_TYPES.get(spec.type, ())
    if not isinstance(value, wanted) or isinstance(value, bool):
        raise ProtocolError(f"{cls.__name__}.{spec.name}: {type(value).__name__}")
    return float(value) if spec.type == "float" else value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(message: Message) -> None:
    """Field checks every receiver relies on (ranges, finiteness, lengths): cloudedge/validation.py."""
    from asyncspec.cloudedge.validation import message_problem  # it imports this module

    problem = message_problem(message)
    if problem:
        raise ProtocolError(f"{type(message).__name__}: {problem}", message)


peek_code = framing.peek_code


def request_of(message: Message) -> int | None:
    """The request a message belongs to (for per-request byte accounting)."""
    if hasattr(message, "id"):
        return message.id.request
    return getattr(message, "request", None)
