"""The wire format: every message round-trips, float32 values arrive bit for bit, garbage is a
ProtocolError (never an exception of another kind), and the compact uplink is small."""

from __future__ import annotations

import pickle
import struct

import msgpack
import numpy as np
import pytest
import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge import wire_arrays

BLOCK_ID = wire.BlockId(123456789, 42, 3, wire.Sampling(0.7, 5).digest())
MESSAGES = [
    wire.Open(1, wire.pack_ids([1, 2, 3]), 3, 0.7, 5, 16, 0),
    wire.Block(BLOCK_ID, 9, wire.pack_ids([4, 5, 6]), wire.pack_probs([0.1, 0.2, 0.3])),
    wire.Verdict(BLOCK_ID, 1, -1, wire.pack_ids([7, 8]), wire.pack_probs([0.5, 0.25]), wire.f32(0.25)),
    wire.Verdict(BLOCK_ID, 3, 11),
    wire.Verdict(BLOCK_ID, 1, 11, settled_by="recovery"),
    wire.Verdict(
        BLOCK_ID,
        1,
        -1,
        wire.pack_ids([7]),
        wire.pack_probs([0.5]),
        wire.f32(0.5),
        proposal_ids=wire.pack_ids([7, 9]),
        proposal_p=wire.pack_probs([0.5, 0.1]),
        proposal_u=wire.pack_probs([0.3, 0.9]),
    ),  # fmt: skip
    wire.Open(1, wire.pack_ids([1, 2, 3]), 3, 0.7, 5, 16, 0, 32),
    wire.CorrectionQuery(BLOCK_ID, "topk", 16, 64),
    wire.Correction(BLOCK_ID, "full", 0, b"", wire.pack_probs(torch.rand(96))),
    wire.Close(1),
    wire.Ping(12.5),
    wire.Pong(12.5, 77, 96, 512, 3),
    wire.Nack(1, 42, "stale"),
    wire.Generate(1, "def f(x):", 16, 0.0, 0, 0.0),
    wire.Token(1, 5, " x"),
    wire.Done(1, "text", wire.pack_ids([5]), "eos", {"ttft_s": 0.1, "nested": {"a": [1, 2]}}),
    wire.Failed(1, "boom"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message):
    assert wire.decode(wire.encode(message)) == message


def test_probabilities_are_lossless_float32():
    values = torch.rand(1000) ** 7  # many tiny values: a lossy encoding would change some
    values[0] = torch.finfo(torch.float32).tiny
    decoded = wire.unpack_probs(wire.pack_probs(values))
    assert torch.equal(decoded.view(torch.int32), values.view(torch.int32))
    x = struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert wire.f32(0.1) == x and wire.decode(wire.encode(wire.Verdict(BLOCK_ID, 0, -1, tail=x))).tail == x


def test_token_ids_round_trip_as_varints_at_every_width():
    edges = [0, 1, 127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**32 - 1]
    rng = torch.Generator().manual_seed(0)
    ids = edges + torch.randint(0, 151_936, (1000,), generator=rng).tolist()
    data = wire.pack_ids(ids)
    assert wire.unpack_ids(data) == ids and wire.id_count(data) == len(ids)
    assert [len(wire.pack_ids([i])) for i in edges] == [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert wire.pack_ids([]) == b"" and wire.unpack_ids(b"") == []
    with pytest.raises(ValueError):
        wire.pack_ids([2**32])


@pytest.mark.parametrize("count", [1, 3, 31, 32, 33])
def test_short_and_long_id_arrays_take_paths_that_agree(count):
    """Under 32 ids (or bytes) the codec loops in Python, above it in numpy: same bytes, same ids,
    the same refusals, on either side of the threshold."""
    rng = torch.Generator().manual_seed(count)
    edges = torch.tensor([0, 127, 128, 16_383, 16_384, 2**28, 2**32 - 1])
    picks = torch.randint(0, 2, (count,), generator=rng).bool()
    ids = torch.where(picks, edges[torch.randint(0, 7, (count,), generator=rng)], torch.randint(0, 151_936, (count,)))
    ids = ids.tolist()
    data = wire_arrays._pack_vectorized(np.asarray(ids, dtype=np.uint64))
    assert (
        wire_arrays._pack_short(ids)
        == data
        == wire.pack_ids(ids)
        == wire.pack_ids(np.asarray(ids))
        == wire.pack_ids(torch.tensor(ids))
    )
    assert (
        wire_arrays._unpack_short(data) == ids == wire_arrays._unpack_vectorized(data).tolist() == wire.unpack_ids(data)
    )
    for broken in (data + b"\x80", data + b"\x80" * 5 + b"\x01", data + b"\xff\xff\xff\xff\x7f"):
        for decode in (wire_arrays._unpack_short, wire_arrays._unpack_vectorized, wire.unpack_ids):
            with pytest.raises(wire.ProtocolError):
                decode(broken)
    for hostile in ([-1], [2**32], [1.5]):
        with pytest.raises((ValueError, TypeError, OverflowError)):
            wire.pack_ids(ids[:2] + hostile)


def test_fields_left_at_their_defaults_are_not_sent():
    block = wire.Block(BLOCK_ID, 9, wire.pack_ids([4, 5, 6]), wire.pack_probs([0.1, 0.2, 0.3]))
    assert len(msgpack.unpackb(wire.encode(block))) == 5  # code and four fields: no empty q_full
    verdict = wire.Verdict(BLOCK_ID, 3, 11)
    assert len(msgpack.unpackb(wire.encode(verdict))) == 4 and wire.decode(wire.encode(verdict)) == verdict


GARBAGE = [
    b"",
    b"\xc1",  # never-used msgpack byte
    b"not msgpack at all",
    msgpack.packb([99, 1, 2]),  # unknown code
    msgpack.packb({"code": 2}),
    msgpack.packb([2, [1, 2], 9, b"", b""]),  # bad block id
    msgpack.packb([2, [1, 2, 3, 4], 9, wire.pack_ids([1, 2]), b""]),  # id says 3 candidates, 2 sent
    msgpack.packb([2, [1, 2, 1, 4], 9, b"\x00\x00\x00", b""]),  # three ids where the id says one
    msgpack.packb([2, [1, 2, 1, 4], 9, b"\x80", b""]),  # the id array ends inside an id
    msgpack.packb([2, [1, 2, 1, 4], 9, b"\x80" * 5 + b"\x01", b""]),  # an id of 6 bytes
    msgpack.packb([2, [1, 2, 1, 4], 9, b"\xff\xff\xff\xff\x7f", b""]),  # an id beyond 32 bits
    msgpack.packb([1, 1, b"\x81", 1, 0.0, 0, 4, 0]),  # an Open whose prompt ends inside an id
    msgpack.packb([4, [1, 2, 1, 4], "everything", 0, 0]),  # unknown correction kind
    msgpack.packb([9, 1, 2, "because"]),
    msgpack.packb([7, "soon"]),
    msgpack.packb([7, True]),
    pickle.dumps(wire.Ping(1.0)),  # pickle is not accepted on the wire
]
# Verdicts whose new fields (a rejection settled in the verdict, attached proposals) are inconsistent
_IDS, _P = wire.pack_ids([7, 9]), wire.pack_probs([0.5, 0.1])
BAD_VERDICTS = [
    wire.Verdict(BLOCK_ID, 1, 11, settled_by="magic"),  # unknown settlement
    wire.Verdict(BLOCK_ID, 1, -1, settled_by="recovery"),  # settled without a token
    wire.Verdict(BLOCK_ID, 3, 11, settled_by="recovery"),  # settled, but every candidate was accepted
    wire.Verdict(BLOCK_ID, 1, 11, proposal_ids=_IDS, proposal_p=_P, proposal_u=_P),  # proposals with a token
    wire.Verdict(BLOCK_ID, 1, -1, proposal_ids=_IDS, proposal_p=_P),  # no uniforms
    wire.Verdict(BLOCK_ID, 1, -1, proposal_ids=_IDS, proposal_p=_P, proposal_u=wire.pack_probs([0.5, 1.5])),
    wire.Verdict(BLOCK_ID, 1, -1, proposal_ids=_IDS, proposal_p=wire.pack_probs([0.5, float("nan")]), proposal_u=_P),
    wire.Verdict(BLOCK_ID, 1, -1, proposal_ids=b"\0" * 4097, proposal_p=b"\0" * 4 * 4097, proposal_u=b"\0" * 4 * 4097),
    wire.Open(1, wire.pack_ids([1, 2, 3]), 3, 0.7, 5, 16, 0, 4097),  # too many proposals asked for
    wire.Open(1, wire.pack_ids([1, 2, 3]), 3, 0.7, 5, 16, 0, -1),
]
GARBAGE += [wire.encode(m) for m in BAD_VERDICTS]
GARBAGE.append(msgpack.packb([3, [1, 2, 1, 4], 0, 5, b"", b"", 0.0, 7]))  # settled_by not a string


@pytest.mark.parametrize("frame", GARBAGE)
def test_malformed_frames_raise_protocol_error(frame):
    with pytest.raises(wire.ProtocolError):
        wire.decode(frame)


def test_compact_uplink_is_small_and_the_full_one_is_not():
    vocab = 151_936  # Qwen2.5-Coder
    q = torch.rand(7, vocab)
    candidates = [100_000 + i for i in range(7)]
    block_id = wire.BlockId(2**40, 1500, 7, wire.Sampling(0.7, 0).digest())
    q_taken = q[torch.arange(7), candidates]
    compact = wire.encode(wire.Block(block_id, 151_000, wire.pack_ids(candidates), wire.pack_probs(q_taken)))
    full = wire.encode(
        wire.Block(block_id, 151_000, wire.pack_ids(candidates), wire.pack_probs(q_taken), wire.pack_probs(q))
    )
    assert len(compact) / 7 <= 12  # ids of 3 varint bytes + float32 q, and the block's header spread over 7
    assert len(full) / 7 >= 4 * vocab


def test_a_rejection_without_support_sends_a_valid_tail_when_p_sums_above_one():
    """First K = 0 ("no top-K"): the tail is all of p, whose float32 sum may exceed 1 by more than the
    receiver's slack; the cloud caps it at 1, so the verdict is valid (a request failed on it before)."""
    from asyncspec.cloudedge.cloud_state import CloudCounters, CloudRequest
    from asyncspec.cloudedge.verdicts import _rejected

    vocab_size = 151_936
    sampling = wire.Sampling(0.7, 1)
    request = CloudRequest(prompt_len=1, sampling=sampling, first_k=0, epoch=0, state=None)
    p = torch.full((vocab_size,), 1.0 / vocab_size) * (1 + 1e-5)
    assert float(p.double().sum()) > 1 + 1e-6
    block = wire.Block(wire.BlockId(1, 5, 1, sampling.digest()), 3, wire.pack_ids([4]), wire.pack_probs([0.9]))
    verdict = _rejected(block, request, 0, p, 4, 0.9, CloudCounters())
    assert verdict.tail == 1.0 and wire.decode(wire.encode(verdict)) == verdict
