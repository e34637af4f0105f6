"""A Whisper target whose windows were encoded ahead of time: `prefill` takes the kept encoder
output instead of running the encoder again. Decode time then measures decoding alone, several
methods share one encoder pass, and a pipeline can encode the next window while this one decodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from asyncspec.models.base import DecodeRequest, DecoderState


class PreEncodedTarget:
    def __init__(self, target):
        self.target = target
        self._encoded: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # id(audio) -> (audio kept alive, output)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def encode(self, request: DecodeRequest) -> torch.Tensor:
        """Encode the request's audio now (once) and keep the output for its prefills."""
        key = id(request.audio)
        if key not in self._encoded:
            self._encoded[key] = (request.audio, self.target.encode_audio(request.audio))
        return self._encoded[key][1]

    def prefill(self, request: DecodeRequest, encoded: torch.Tensor | None = None) -> DecoderState:
        return self.target.prefill(request, encoded if encoded is not None else self.encode(request))
