"""Figures: matplotlib's file-only backend, chosen once here before pyplot loads, and the helpers
every figure shares.

Import this module inside the function that draws, never at a module's top: matplotlib takes about
a second to import, and neither the command line nor the services draw anything."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: servers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

__all__ = ["plt", "save", "step_cdf"]


def save(figure, path: str | Path, dpi: int = 110) -> Path:
    """Lay the figure out, write it, and free it (pyplot keeps every open figure alive)."""
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return Path(path)


def step_cdf(axis, values: Iterable[float], label: str) -> None:
    """The empirical CDF of `values` as a step line (nothing for no values)."""
    ordered = sorted(values)
    if ordered:
        axis.step(ordered, np.arange(1, len(ordered) + 1) / len(ordered), where="post", label=label)
