"""asyncspec: speculative decoding that decouples drafting from verification.

    from asyncspec import Transcriber
    with Transcriber("whisper-base") as t:
        segments, info = t.transcribe("talk.mp3")

The names below load lazily, so `import asyncspec` stays light (no torch until a model is used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LongformOptions", "Segment", "Transcriber", "TranscriptionInfo", "__version__"]

_EXPORTS = {
    "Transcriber": "asyncspec.transcription.api",
    "TranscriptionInfo": "asyncspec.transcription.api",
    "LongformOptions": "asyncspec.transcription.longform",
    "Segment": "asyncspec.transcription.segments",
}

if TYPE_CHECKING:
    from asyncspec.transcription.api import Transcriber, TranscriptionInfo
    from asyncspec.transcription.longform import LongformOptions
    from asyncspec.transcription.segments import Segment


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'asyncspec' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
