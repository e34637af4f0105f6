"""The figure of `asyncspec listen --auto` (kept out of the service module: only the report draws)."""

from __future__ import annotations

import numpy as np

from asyncspec.ondemand.streaming import TRAILING_BLOCKS, BlockRecord


def _trailing(values: list[float], width: int = TRAILING_BLOCKS) -> list[float]:
    return [float(np.mean(values[max(0, i + 1 - width) : i + 1])) for i in range(len(values))]


def plot_streaming(records: list[BlockRecord], block_s: float, path, title: str) -> None:
    """Seed 000 Figure 9: completion lag and queue wait per block, RTF and decode throughput trailing."""
    from asyncspec.plots import plt, save

    x = [r.arrival_s for r in records]
    figure, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    axes[0].plot(x, [r.completion_lag_s for r in records], ".-", label="completion lag", linewidth=0.8)
    axes[0].plot(x, [r.queue_wait_s for r in records], ".-", label="queue wait", linewidth=0.8)
    axes[0].axhline(block_s + 1.0, color="#b22", linestyle="--", linewidth=1, label=f"block + 1 s = {block_s + 1:g} s")
    axes[0].set_ylabel("seconds")
    axes[0].legend(fontsize=8)
    axes[1].plot(x, _trailing([r.active_rtf for r in records]), label="active RTF (target path)")
    axes[1].plot(x, _trailing([r.resource_rtf for r in records]), label="resource RTF (all service time)")
    axes[1].axhline(1.0, color="#333", linestyle=":", linewidth=1)
    axes[1].set_ylabel(f"RTF (trailing {TRAILING_BLOCKS})")
    axes[1].legend(fontsize=8)
    axes[2].plot(x, _trailing([r.decode_tps for r in records]), color="#2a7")
    axes[2].set_ylabel("decode tokens/s")
    axes[2].set_xlabel("input arrival time (s)")
    axes[0].set_title(title)
    save(figure, path)
