"""Hostile inputs for the adversarial suite: random and mutated protocol frames, and malformed HTTP
requests for the edge and for `listen`. Deterministic (seeded) so a failure can be replayed."""

from __future__ import annotations

import io
import json
import math
import random

import msgpack
import numpy as np
import soundfile

from asyncspec.cloudedge import protocol as wire

HOSTILE_INTS = [-1, -(2**63), 2**31, 2**32, 2**63 - 1, 2**64 - 1, 0, 1, 4095, 10**9]
HOSTILE_FLOATS = [math.nan, math.inf, -math.inf, 1e-45, 1e39, -1.0, 0.0, 1.0, 1e300, 5e-324]
HOSTILE_STRINGS = ["", "x" * 5000, "\x00", "\ud7ff", "topk", "full", "proposals", "busy", "💥" * 100]
SMALL_VOCAB_IDS = [0, 1, 5, 50, 95, 96, 97, 2**32 - 1]


def hostile_value(rng: random.Random):
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice(HOSTILE_INTS)
    if kind == 1:
        return rng.choice(HOSTILE_FLOATS)
    if kind == 2:
        return rng.choice(HOSTILE_STRINGS)
    if kind == 3:
        return rng.randbytes(rng.choice([0, 1, 3, 4, 8, 400, 4096]))
    if kind == 4:
        return [hostile_value(rng) for _ in range(rng.randrange(5))]
    if kind == 5:
        return {"k": hostile_value(rng)} if rng.random() < 0.5 else None
    return rng.choice([True, False])


def ids(rng: random.Random, n: int) -> bytes:
    return wire.pack_ids([rng.choice(SMALL_VOCAB_IDS[:4]) for _ in range(n)])


def probs(rng: random.Random, n: int) -> bytes:
    values = [rng.choice([0.5, 0.0, 1.0, math.nan, -0.5, 2.0, math.inf]) for _ in range(n)]
    return np.asarray(values, dtype="<f4").tobytes()


def plausible_message(rng: random.Random, request: int) -> wire.Message:
    """A well-formed message with hostile-but-typed contents (many pass decoding and reach a handler)."""
    n = rng.choice([0, 1, 2, 3, 5])
    sampling = wire.Sampling(rng.choice([0.0, 1.0]), rng.choice([0, 2**63, 2**64 - 1]))
    block_id = wire.BlockId(request, rng.choice([1, 2, 3, 4, 600]), n, rng.choice([sampling.digest(), 0, 2**32 - 1]))
    choices = [
        lambda: wire.Open(
            request,
            ids(rng, rng.choice([0, 2, 3, 700])),
            rng.choice([0, 2, 9]),
            sampling.temperature,
            sampling.seed,
            rng.choice([0, 4, 5000]),
            rng.choice([0, 1, 2]),
        ),  # fmt: skip
        lambda: wire.Block(block_id, rng.choice([3, 95, 96, 2**31]), ids(rng, n), rng.choice([b"", probs(rng, n)])),
        lambda: wire.CorrectionQuery(
            block_id, rng.choice(["topk", "proposals", "full"]), rng.randrange(100), rng.choice([0, 10, 5000, 2**24])
        ),  # fmt: skip
        lambda: wire.Close(request),
        lambda: wire.Ping(rng.random()),
        lambda: wire.Verdict(block_id, rng.randrange(4), rng.choice([-1, 3])),
        lambda: wire.Generate(
            request,
            rng.choice(["w3 w4", "", "zzz"]),
            rng.choice([1, 2, 3, 4]),
            sampling.temperature,
            sampling.seed,
            rng.choice([0.0, 0.5]),
        ),  # fmt: skip
    ]
    return rng.choice(choices)()


def mutated(frame: bytes, rng: random.Random) -> bytes:
    """A valid frame after one structural or byte-level mutation."""
    how = rng.randrange(4)
    if how == 0 and frame:  # flip bytes
        data = bytearray(frame)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if how == 1:  # truncate
        return frame[: rng.randrange(len(frame) + 1)]
    body = msgpack.unpackb(frame, raw=False)
    if how == 2 and len(body) > 1:  # one field replaced by a hostile value
        body[rng.randrange(1, len(body))] = hostile_value(rng)
    else:  # fields added or dropped
        body = body[: rng.randrange(1, len(body) + 1)] + [hostile_value(rng) for _ in range(rng.randrange(3))]
    return msgpack.packb(body, use_bin_type=True)


def random_frame(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return rng.randbytes(rng.randrange(0, 300))
    code = rng.choice([*wire.MESSAGES, 0, 10, 99, -1])
    return msgpack.packb([code, *[hostile_value(rng) for _ in range(rng.randrange(9))]], use_bin_type=True)


def conversation(rng: random.Random, request: int, epoch: int) -> list[wire.Message]:
    """Frames that follow the protocol far enough to reach verification and correction: an Open, a block
    at the right position with the right digest, hostile correction queries, a resync, a Close."""
    sampling = wire.Sampling(rng.choice([0.0, 1.0, 0.5]), rng.choice([0, 7, 2**64 - 1]))
    tokens = [rng.randrange(95) for _ in range(rng.choice([1, 2, 5]))]
    n = rng.choice([0, 1, 3, 6])
    block_id = wire.BlockId(request, len(tokens) + 1, n, sampling.digest())
    q = np.asarray([rng.choice([1.0, 1e-30, 0.5, 0.0]) for _ in range(n)], dtype="<f4").tobytes()
    block = wire.Block(block_id, rng.choice([0, 94, 95]), ids(rng, n), q if sampling.temperature else b"")
    queries = [
        wire.CorrectionQuery(
            block_id,
            rng.choice(["topk", "proposals", "full"]),
            rng.choice([0, 4, 95, 2**24]),
            rng.choice([0, 1, 96, 4096, 2**24]),
        )  # fmt: skip
        for _ in range(rng.randrange(1, 4))
    ]
    opened = wire.Open(request, wire.pack_ids(tokens), len(tokens), sampling.temperature, sampling.seed, 8, epoch)
    resync = wire.Open(request, wire.pack_ids(tokens), len(tokens), sampling.temperature, sampling.seed, 8, epoch + 1)
    closing = [wire.Close(request)] if rng.random() < 0.5 else []
    return [opened, block, *queries, resync, block, *closing]


def frames(rng: random.Random, count: int, requests: list[int]) -> list[list[bytes]]:
    """`count` multipart messages (usually one part): random, mutated and plausible-but-hostile frames."""
    out, epoch = [], 0
    while len(out) < count:
        roll = rng.random()
        if roll < 0.1:
            epoch += 2
            out += [[wire.encode(m)] for m in conversation(rng, rng.choice(requests), epoch)]
            continue
        if roll < 0.2:
            parts = [random_frame(rng)]
        elif roll < 0.55:
            parts = [mutated(wire.encode(plausible_message(rng, rng.choice(requests))), rng)]
        else:
            parts = [wire.encode(plausible_message(rng, rng.choice(requests)))]
        if rng.random() < 0.03:
            parts = parts + [rng.randbytes(8)]  # an extra part: malformed for the ROUTER
        out.append(parts)
    return out[:count]


# ---------------------------------------------------------------- HTTP

EDGE_FIELDS = {
    "temperature": [1e-45, 1e39, -1, "1", [], math.nan],
    "seed": [-1, 2**64, 1.5, "7", [1]],
    "max_tokens": [0, -5, 10**9, "4", 2.5, True],
    "n": [2, 0, "1"],
    "best_of": [2, 5],
    "logprobs": [6, -1, "3", 2.5],
    "top_logprobs": [2, 9],  # without logprobs: refused
    "stop": [5, ["a", "b", "c", "d", "e"], [1], "x" * 300],
    "top_p": [0, 2, "0.5", math.nan],
    "presence_penalty": [3, "1", math.inf],
    "frequency_penalty": [-2.5, [0]],
    "user": [5, ["u"], "u" * 300],
    "eps_req": [-1, 2, "x", math.inf],
    "stream": ["yes", 1],
    "prompt": ["", 5, None, ["a", "b"], {"x": 1}],
}


def hostile_edge_request(rng: random.Random) -> dict:
    """(path, body bytes, headers): every one must be refused with a 4xx."""
    roll = rng.random()
    base = {"prompt": "w3 w4", "max_tokens": 2, "temperature": 0}
    if roll < 0.6:
        body = dict(base)
        for name in rng.sample(sorted(EDGE_FIELDS), rng.randrange(1, 3)):
            body[name] = rng.choice(EDGE_FIELDS[name])
        data = json.dumps(body, allow_nan=True).encode()
        return {"path": "/v1/completions", "content": data}
    if roll < 0.7:
        data = rng.choice([b"{", b"[]", b"null", b'"x"', b"\xff" * 10, b"[" * 100_000, rng.randbytes(200)])
        return {"path": rng.choice(["/v1/completions", "/v1/chat/completions"]), "content": data}
    if roll < 0.8:
        return {"path": "/v1/completions", "content": b'{"prompt": "' + b"w1 " * 400_000 + b'"}'}  # > 1 MB cap
    if roll < 0.9:
        messages = rng.choice([None, [], [{"role": "user"}], [{"role": 1, "content": "x"}], "hi", [{"content": []}]])
        return {"path": "/v1/chat/completions", "content": json.dumps({"messages": messages}).encode()}
    return {"path": "/v1/completions", "method": "GET"}  # wrong method: 405


def header_bomb(rate: int, channels: int, fmt: str = "FLAC", frames: int = 2000) -> bytes:
    """A small file whose header promises a huge decode (rate x channels)."""
    out = io.BytesIO()
    soundfile.write(out, np.zeros((frames, channels), np.float32), rate, format=fmt)
    return out.getvalue()


LISTEN_BOMBS = [header_bomb(384_000, 8), header_bomb(200_000, 1), header_bomb(16_000, 16, "WAV")]


def hostile_listen_request(rng: random.Random) -> dict:
    roll = rng.random()
    if roll < 0.35:
        return {"files": {"file": ("bomb.flac", rng.choice(LISTEN_BOMBS), "audio/flac")}}
    if roll < 0.5:
        return {"files": {"file": ("junk.wav", rng.randbytes(rng.randrange(0, 3000)), "audio/wav")}}
    if roll < 0.6:
        return {"files": {"file": ("big.wav", b"\0" * 300_000, "audio/wav")}}  # over the test's 200 KB cap
    if roll < 0.75:
        field = rng.choice([{"temperature": "nan"}, {"temperature": "1e-45"}, {"response_format": "mp3"},
                            {"language": "x" * 300}, {"method": "nope"}])  # fmt: skip
        return {"files": {"file": ("ok.wav", _tiny_wav(), "audio/wav")}, "data": field}
    if roll < 0.9:
        return {"content": rng.randbytes(rng.randrange(1, 2000)), "headers": {"content-type": "multipart/form-data"}}
    return {"data": {"model": "whisper-base"}}  # no file part


def _tiny_wav() -> bytes:
    out = io.BytesIO()
    soundfile.write(out, (0.3 * np.sin(np.arange(8000) / 5)).astype(np.float32), 16_000, format="WAV")
    return out.getvalue()
