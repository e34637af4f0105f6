"""What a service's uploads are transcribed with: the library's Transcriber over the models the
service loaded (so an upload takes the path `asyncspec transcribe` takes: long-form, segments)."""

from __future__ import annotations

from typing import Any

from asyncspec.decoding.result import DecodeConfig


def upload_transcriber(target, drafters: dict[str, Any], config: DecodeConfig):
    """The library's Transcriber over the service's models, for uploads: As²d where the producer's
    drafts carry audio time (the ct2-chunk kind), sd/specasr with their drafter."""
    from asyncspec.transcription.api import Transcriber
    from asyncspec.transcription.loading import LONGFORM_PRODUCER

    usable = dict(drafters)
    spec = getattr(usable.get("as2d"), "spec", None)
    if usable.get("as2d") is not None and getattr(spec, "kind", None) != LONGFORM_PRODUCER:
        usable.pop("as2d")
    budgets = dict(config.method_budgets)
    return Transcriber.from_loaded(
        target,
        usable,
        target.name,
        budget=config.budget,
        as2d_budget=budgets.get("as2d"),
        producer_model=getattr(spec, "drafter", "whisper-tiny.en"),
        drafter=getattr(drafters.get("sd"), "name", "whisper-tiny.en"),
    )
