"""Stacked calls: several blocks of the engine's width computed in one call, where the invariance
self-test's batch check proved those stacks equal (models/batch_check.py)."""

from __future__ import annotations


def stack_sizes(most_blocks: int) -> list[int]:
    """The blocks a stacked call may hold: 2, 4, 8, ... up to `most_blocks`. The invariance
    self-test's batch check runs exactly these widths, and `run_stacked` makes no other."""
    sizes = [2]
    while sizes[-1] * 2 <= most_blocks:
        sizes.append(sizes[-1] * 2)
    return sizes if most_blocks >= 2 else []


def cut_into_stacks(blocks: int, most_blocks: int) -> list[int]:
    """Blocks per call for `blocks` blocks: the largest stack size that fits, again and again; a
    lone block left over is a call of its own (the per-request shape)."""
    sizes, calls = [1, *stack_sizes(most_blocks)], []
    while blocks:
        calls.append(max(size for size in sizes if size <= blocks))
        blocks -= calls[-1]
    return calls
