"""Field checks for everything that crosses a service boundary, in one place per interface.

`message_problem` holds the checks a frame must pass whoever receives it (ranges, finiteness,
consistent lengths); `protocol.decode` calls it, so a frame that fails never reaches a service.
The checks that need the receiver's state (its vocabulary, its positions, its verification
width) are `open_problem` and `block_problem` (cloud) and `reply_problem` (edge).
`sampling_problem` is shared with the HTTP and ZeroMQ client fronts: one rule for temperature
and seed everywhere.

Each check returns None (fine) or a sentence saying what is wrong, which becomes the error the
peer sees.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from asyncspec.cloudedge import protocol as wire
from asyncspec.shaping import shaping_problem

# Temperatures below this turn fp32 logits / T into inf (1e-45 did: NaN probabilities in the
# drafter's multinomial); above MAX the law is uniform to fp32 precision and nobody means it.
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0
_F32_MIN, _F32_MAX = wire.f32(MIN_TEMPERATURE), wire.f32(MAX_TEMPERATURE)
UINT64_MAX = 2**64 - 1
UINT32_MAX = 2**32 - 1
MAX_BLOCK_CANDIDATES = 256  # no edge policy drafts more; the cloud's own cap (max_block) is tighter
MAX_WIRE_TOKENS = 1 << 20  # tokens in one Open: far beyond any model's positions
MAX_QUERY_INDEX = 1 << 24  # top-K / proposal-round indices: far beyond any vocabulary
MAX_TEXT_CHARS = 200_000  # a Generate prompt: the edge tokenizes it in its loop thread, so it stays short
MAX_TOP_LOGPROBS = 5  # alternatives per position with log-probabilities (logprobs.py)
MAX_PROPOSALS = 4096  # exact-recovery proposals in one Verdict or Correction
PROBABILITY_SLACK = 1e-6  # float32 softmax outputs may exceed 1 by an ulp


def sampling_problem(temperature, seed) -> str | None:
    """Temperature 0 (greedy) or within [MIN_TEMPERATURE, MAX_TEMPERATURE]; seed an unsigned 64-bit integer."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        return "temperature must be a number"
    if not math.isfinite(temperature) or temperature < 0:
        return f"temperature must be a finite number >= 0, not {temperature!r}"
    # compared as the float32 it travels as: 0.01 rounds to 0.0099999998 on the wire, below a float64 0.01
    in_range = temperature <= 2 * MAX_TEMPERATURE and _F32_MIN <= wire.f32(temperature) <= _F32_MAX
    if temperature != 0 and not in_range:
        return f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}, not {temperature!r}"
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= UINT64_MAX:
        return f"seed must be an integer between 0 and 2**64 - 1, not {seed!r}"
    return None


def probabilities_problem(data: bytes, name: str) -> str | None:
    """float32 probabilities: finite, within [0, 1]."""
    if len(data) % 4:
        return f"{name}: length is not a multiple of 4"
    values = np.frombuffer(data, dtype="<f4")
    if not np.isfinite(values).all():
        return f"{name}: NaN or infinite probabilities"
    if values.size and (values.min() < 0 or values.max() > 1 + PROBABILITY_SLACK):
        return f"{name}: probabilities outside [0, 1]"
    return None


def logprobs_problem(data: bytes, name: str) -> str | None:
    """float32 log-probabilities: at most 0 (up to rounding), -inf allowed, never NaN."""
    if len(data) % 4:
        return f"{name}: length is not a multiple of 4"
    values = np.frombuffer(data, dtype="<f4")
    if np.isnan(values).any() or (values.size and values.max() > PROBABILITY_SLACK):
        return f"{name}: not log-probabilities"
    return None


def ids_problem(data: bytes, name: str) -> str | None:
    """A well-formed varint id array (protocol.pack_ids)."""
    try:
        wire.id_array(data)
    except wire.ProtocolError as error:
        return f"{name}: {error}"
    return None


def _mass_problem(value: float, name: str) -> str | None:
    if not math.isfinite(value) or not 0 <= value <= 1 + PROBABILITY_SLACK:
        return f"{name} must be a probability mass in [0, 1]"
    return None


def _range_problem(name: str, value: int, low: int, high: int) -> str | None:
    return None if low <= value <= high else f"{name} {value} outside [{low}, {high}]"


def _first(*problems: str | None) -> str | None:
    return next((p for p in problems if p), None)


def _block_id_problem(block_id: wire.BlockId) -> str | None:
    return _first(
        _range_problem("request", block_id.request, 0, UINT64_MAX),
        _range_problem("base", block_id.base, 0, MAX_WIRE_TOKENS),
        _range_problem("n", block_id.n, 0, MAX_BLOCK_CANDIDATES),
        _range_problem("config", block_id.config, 0, UINT32_MAX),
    )


def _open_fields(m: wire.Open) -> str | None:
    count = wire.id_count(m.tokens)  # one byte per byte; the id array costs ~50 bytes per byte
    if count > MAX_WIRE_TOKENS:  # so refused before the array is built
        return f"tokens must be at most {MAX_WIRE_TOKENS}, not {count}"
    return _first(
        ids_problem(m.tokens, "tokens"),
        _range_problem("request", m.request, 0, UINT64_MAX),
        _range_problem("prompt_len", m.prompt_len, 0, count + 1),
        sampling_problem(m.temperature, m.seed),
        shaping_problem(m.top_p, m.presence_penalty, m.frequency_penalty),
        _range_problem("first_k", m.first_k, 0, MAX_QUERY_INDEX),
        _range_problem("epoch", m.epoch, 0, UINT32_MAX),
        _range_problem("first_proposals", m.first_proposals, 0, MAX_PROPOSALS),
        _range_problem("logprobs", m.logprobs, -1, MAX_TOP_LOGPROBS),
    )


def _block_fields(m: wire.Block) -> str | None:
    if len(m.candidates) > 5 * MAX_BLOCK_CANDIDATES:  # checked on the bytes, before any decoding
        return f"Block: more than {MAX_BLOCK_CANDIDATES} candidates"
    problem = ids_problem(m.candidates, "candidates")
    if problem:
        return problem
    n = wire.id_count(m.candidates)
    if n != m.id.n or (m.q and len(m.q) != 4 * n) or (m.q_full and len(m.q_full) % (4 * max(n, 1))):
        return "Block: candidates, q and id disagree"
    return _first(
        _block_id_problem(m.id),
        _range_problem("root", m.root, 0, UINT32_MAX),
        probabilities_problem(m.q, "q"),
        probabilities_problem(m.q_full, "q_full"),
    )


def _verdict_fields(m: wire.Verdict) -> str | None:
    problem = ids_problem(m.support_ids, "support_ids") or ids_problem(m.proposal_ids, "proposal_ids")
    if problem:
        return problem
    if 4 * wire.id_count(m.support_ids) != len(m.support_p):
        return "Verdict: support ids and probabilities disagree"
    proposals = wire.id_count(m.proposal_ids)
    if not 4 * proposals == len(m.proposal_p) == len(m.proposal_u):
        return "Verdict: proposal ids, probabilities and uniforms disagree"
    if proposals > MAX_PROPOSALS:
        return f"Verdict: more than {MAX_PROPOSALS} proposals"
    if m.settled_by not in wire.SETTLED_BY:
        return f"unknown settlement {m.settled_by!r}"
    if m.settled_by and (m.token < 0 or m.accepted >= m.id.n):
        return "Verdict: a settled rejection needs a token and a rejected candidate"
    if m.proposal_ids and m.token >= 0:
        return "Verdict: proposals come only with an open correction"
    return _first(
        _block_id_problem(m.id),
        _range_problem("accepted", m.accepted, 0, m.id.n),
        _range_problem("token", m.token, -1, UINT32_MAX),
        probabilities_problem(m.support_p, "support_p"),
        _mass_problem(m.tail, "tail"),
        probabilities_problem(m.proposal_p, "proposal_p"),
        probabilities_problem(m.proposal_u, "proposal_u"),
        ids_problem(m.top_ids, "top_ids"),
        logprobs_problem(m.logprobs, "logprobs"),
        logprobs_problem(m.top_logprobs, "top_logprobs"),
    )


def _query_fields(m: wire.CorrectionQuery) -> str | None:
    if m.kind not in wire.CORRECTION_KINDS:
        return f"unknown correction kind {m.kind!r}"
    return _first(
        _block_id_problem(m.id),
        _range_problem("start", m.start, 0, MAX_QUERY_INDEX),
        _range_problem("stop", m.stop, 0, MAX_QUERY_INDEX),
    )


def _correction_fields(m: wire.Correction) -> str | None:
    if m.kind not in wire.CORRECTION_KINDS:
        return f"unknown correction kind {m.kind!r}"
    problem = ids_problem(m.ids, "ids")
    if problem:
        return problem
    if m.kind != "full" and 4 * wire.id_count(m.ids) != len(m.p):
        return "Correction: ids and probabilities disagree"
    return _first(
        _block_id_problem(m.id),
        _range_problem("start", m.start, 0, MAX_QUERY_INDEX),
        probabilities_problem(m.p, "p"),
        _mass_problem(m.tail, "tail"),
    )


def _generate_fields(m: wire.Generate) -> str | None:
    if not math.isfinite(m.eps_req) or not 0 <= m.eps_req <= 1:
        return f"eps_req must be within [0, 1], not {m.eps_req!r}"
    return _first(
        _range_problem("tag", m.tag, 0, UINT64_MAX),
        _range_problem("prompt length", len(m.prompt), 1, MAX_TEXT_CHARS),
        _range_problem("max_new_tokens", m.max_new_tokens, 1, MAX_WIRE_TOKENS),
        sampling_problem(m.temperature, m.seed),
    )


def _simple_fields(m: wire.Message) -> str | None:
    if isinstance(m, wire.Nack) and m.reason not in wire.NACK_REASONS:
        return f"unknown nack reason {m.reason!r}"
    if isinstance(m, wire.Ping | wire.Pong) and not math.isfinite(m.sent):
        return "ping time must be finite"
    if isinstance(m, wire.Close | wire.Nack):
        return _range_problem("request", m.request, 0, UINT64_MAX)
    if isinstance(m, wire.Pong):
        return _first(
            _range_problem("vocab_size", m.vocab_size, 1, UINT32_MAX),
            _range_problem("max_length", m.max_length, 1, MAX_WIRE_TOKENS),
        )
    return None


_FIELD_CHECKS: dict[type, Callable[[Any], str | None]] = {
    wire.Open: _open_fields,
    wire.Block: _block_fields,
    wire.Verdict: _verdict_fields,
    wire.CorrectionQuery: _query_fields,
    wire.Correction: _correction_fields,
    wire.Generate: _generate_fields,
}


def message_problem(message: wire.Message) -> str | None:
    """What is wrong with a decoded message's fields on their own (None: nothing)."""
    check = _FIELD_CHECKS.get(type(message), _simple_fields)
    return check(message)


# ---------------------------------------------------------------- checks against the receiver's state


def open_problem(message: wire.Open, vocab_size: int, max_length: int, first_k_cap: int) -> str | None:
    """An Open the cloud can prefill: its tokens fit the target's vocabulary and positions."""
    tokens = wire.id_array(message.tokens)
    if tokens.size + 1 > max_length:
        return f"{tokens.size} tokens exceed the target's {max_length} positions"
    if tokens.size and int(tokens.max()) >= vocab_size:
        return f"a token id is outside the vocabulary ({vocab_size})"
    return _range_problem("first_k", message.first_k, 0, first_k_cap)


def block_problem(block: wire.Block, sampled: bool, vocab_size: int, max_length: int, max_block: int) -> str | None:
    """A block the cloud can verify: width, positions, ids, and q present exactly when sampling needs it."""
    candidates = wire.id_array(block.candidates)
    if candidates.size > max_block:
        return f"{candidates.size} candidates exceed the verification width {max_block}"
    if block.id.base < 1 or block.id.base + candidates.size > max_length:
        return "the block's positions lie outside the target's"
    if block.root >= vocab_size or (candidates.size and int(candidates.max()) >= vocab_size):
        return f"a token id is outside the vocabulary ({vocab_size})"
    if block.q_full and len(block.q_full) != 4 * candidates.size * vocab_size:
        return "q_full does not cover the vocabulary"
    if sampled and not block.q and not block.q_full and candidates.size:
        return "a sampled block needs q"
    return None


def reply_problem(message: wire.Message, vocab_size: int) -> str | None:
    """A cloud reply the edge can act on: every token id it names lies in the vocabulary."""
    ids = b""
    if isinstance(message, wire.Verdict):
        if message.token >= vocab_size:
            return f"the cloud's token {message.token} is outside the vocabulary ({vocab_size})"
        ids = message.support_ids + message.proposal_ids + message.top_ids
    elif isinstance(message, wire.Correction):
        ids = message.ids
    values = wire.id_array(ids)
    if values.size and int(values.max()) >= vocab_size:
        return f"the cloud named a token outside the vocabulary ({vocab_size})"
    return None
