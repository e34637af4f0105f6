"""Reading a frame before trusting it: its message code from the first bytes (so a receiver caps
each type's bytes before decoding), and msgpack with a cap on arrays and maps."""

from __future__ import annotations

import msgpack

MAX_CONTAINERS = 64  # arrays and maps in one frame: a message has a handful (body, block id, stats)


def peek_code(frame: bytes) -> int | None:
    """A frame's message code read from its first bytes (a msgpack array header, then a positive
    fixint), without decoding: receivers cap each message type's bytes before any decoding."""
    offset = {0xDC: 3, 0xDD: 5}.get(frame[0], 1 if 0x90 <= frame[0] <= 0x9F else 0) if frame else 0
    if not offset or len(frame) <= offset or frame[offset] >= 0x80:
        return None
    return frame[offset]


def unpack_bounded(frame: bytes):
    """msgpack with a cap on arrays and maps: an empty array is one byte on the wire and ~60 in
    memory, so a frame of nested empty arrays would grow ~60-fold; scalars grow at most ~14-fold."""
    containers = 0

    def counted(value):
        nonlocal containers
        containers += 1
        if containers > MAX_CONTAINERS:
            raise ValueError(f"more than {MAX_CONTAINERS} arrays and maps")
        return value

    return msgpack.unpackb(frame, raw=False, strict_map_key=True, list_hook=counted, object_hook=counted)
