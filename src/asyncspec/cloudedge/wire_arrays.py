"""The arrays inside protocol frames: token ids as unsigned LEB128 varints, probabilities as
little-endian float32 bytes (the exact value the sender sampled with), and the error a frame that
breaks them raises."""

from __future__ import annotations

import operator
import struct
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from asyncspec.cloudedge.protocol import Message


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol. `message`: the decoded message when
    only its field checks failed, so the receiver can answer the request it names."""

    def __init__(self, text: str, message: Message | None = None):
        super().__init__(text)
        self.message = message


# ---------------------------------------------------------------- arrays on the wire


_VARINT_BYTES = 5  # an unsigned 32-bit id needs at most 5 groups of 7 bits
_UINT32_MAX = 2**32 - 1


_SHORT = 32  # below this many ids (every block, most verdicts) a Python loop beats numpy's per-call cost


def pack_ids(ids) -> bytes:
    """Token ids as unsigned LEB128 varints (7 bits a byte, high bit = more follows). Ids below
    16,384 take 2 bytes and every id of a 151,665-token vocabulary at most 3, against 4 as uint32:
    an id was half of each candidate's uplink and all of the prompt's."""
    if isinstance(ids, (torch.Tensor, np.ndarray)) and _size(ids) < _SHORT:
        ids = ids.reshape(-1).tolist()
    if isinstance(ids, (list, tuple)) and len(ids) < _SHORT:
        return _pack_short(ids)
    return _pack_vectorized(np.asarray(ids, dtype=np.uint64).reshape(-1))


def _size(array: torch.Tensor | np.ndarray) -> int:
    return array.numel() if isinstance(array, torch.Tensor) else array.size


def _pack_short(ids) -> bytes:
    out = bytearray()
    for value in map(operator.index, ids):
        if not 0 <= value <= _UINT32_MAX:
            raise ValueError("token ids are unsigned 32-bit integers")
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def _pack_vectorized(values: np.ndarray) -> bytes:
    if values.size and int(values.max()) > _UINT32_MAX:
        raise ValueError("token ids are unsigned 32-bit integers")
    widths = np.ones(values.size, dtype=np.int64)
    for group in range(1, _VARINT_BYTES):
        widths += values >= np.uint64(1 << (7 * group))
    starts = np.cumsum(widths) - widths
    out = np.zeros(int(widths.sum()), dtype=np.uint8)
    for group in range(_VARINT_BYTES):
        rows = widths > group
        low7 = (values[rows] >> np.uint64(7 * group)) & np.uint64(0x7F)
        more = (widths[rows] > group + 1).astype(np.uint64) << np.uint64(7)
        out[starts[rows] + group] = (low7 | more).astype(np.uint8)
    return out.tobytes()


def id_count(data: bytes) -> int:
    """How many ids a (well-formed) varint array holds: one byte of each ends it."""
    return int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) < 0x80))


def id_array(data: bytes) -> np.ndarray:
    """The ids of a varint array (int64), or ProtocolError when it is truncated, has an id longer
    than 5 bytes or one beyond 32 bits."""
    if len(data) < _SHORT:
        return np.array(_unpack_short(data), dtype=np.int64)
    return _unpack_vectorized(data)


def _unpack_short(data: bytes) -> list[int]:
    values: list[int] = []
    value = shift = width = 0
    for byte in data:
        width += 1
        if width > _VARINT_BYTES:
            raise ProtocolError(f"a token id longer than {_VARINT_BYTES} bytes")
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            if value > _UINT32_MAX:
                raise ProtocolError("a token id beyond 32 bits")
            values.append(value)
            value = shift = width = 0
    if width:
        raise ProtocolError("token-id array ends inside an id")
    return values


def _unpack_vectorized(data: bytes) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw[-1] >= 0x80:
        raise ProtocolError("token-id array ends inside an id")
    ends = np.flatnonzero(raw < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    widths = ends - starts + 1
    if int(widths.max()) > _VARINT_BYTES:
        raise ProtocolError(f"a token id longer than {_VARINT_BYTES} bytes")
    values = np.zeros(ends.size, dtype=np.int64)
    for group in range(_VARINT_BYTES):
        rows = widths > group
        values[rows] |= (raw[starts[rows] + group].astype(np.int64) & 0x7F) << (7 * group)
    if int(values.max()) > _UINT32_MAX:
        raise ProtocolError("a token id beyond 32 bits")
    return values


def unpack_ids(data: bytes) -> list[int]:
    if len(data) < _SHORT:
        return _unpack_short(data)
    return _unpack_vectorized(data).tolist()


def pack_probs(values) -> bytes:
    """float32 values (a tensor, array or list of floats that are float32) -> bytes, losslessly."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to(torch.float32).cpu().numpy()
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_probs(data: bytes) -> torch.Tensor:
    if len(data) % 4:
        raise ProtocolError("float32 array length is not a multiple of 4")
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").copy())


def f32(value: float) -> float:
    """The float32 value nearest `value`, as a Python float (exact in msgpack's float64)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]
