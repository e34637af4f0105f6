"""Resident memory of the service: the process as the OS sees it, and what the service retains."""

from __future__ import annotations

from typing import Any

import psutil

MIB = 1 << 20


def model_bytes(model: Any) -> int:
    """Parameters and buffers of a transformers backend (0 for other drafters, e.g. a producer process)."""
    module = getattr(model, "model", None)
    if module is None or not hasattr(module, "parameters"):
        return 0
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_report(target, drafters: dict[str, Any], window, preparer, producer_pid: int | None = None) -> dict:
    """MiB figures: resident set of this process (and of the producer worker), model weights,
    the retained audio window and the prepared state of the latest window."""
    drafter_models = {id(d): d for d in drafters.values() if d is not None}
    report = {
        "rss_mib": psutil.Process().memory_info().rss / MIB,
        "target_weights_mib": model_bytes(target) / MIB,
        "drafter_weights_mib": sum(model_bytes(d) for d in drafter_models.values()) / MIB,
        "audio_window_mib": window.nbytes / MIB,
        "prepared_state_mib": (preparer.latest.nbytes if preparer and preparer.latest else 0) / MIB,
    }
    if producer_pid:
        try:
            report["producer_rss_mib"] = psutil.Process(producer_pid).memory_info().rss / MIB
        except psutil.Error:
            report["producer_rss_mib"] = None
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in report.items()}
