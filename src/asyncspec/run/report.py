"""Shared output: a record per window and method, its human-readable lines, JSON files, progress."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch: not for the light commands that only write JSON
    from asyncspec.decoding.result import DecodeResult
    from asyncspec.models.base import Decoder


def result_record(result: DecodeResult, target: Decoder, **context: Any) -> dict[str, Any]:
    stats = result.stats
    return {
        **context,
        "method": result.method,
        "text": target.tokenizer.decode(result.tokens).strip(),
        "token_ids": result.tokens,
        "n_tokens": len(result.tokens),
        "prefill_s": round(stats.prefill_s, 4),
        "decode_s": round(stats.decode_s, 4),
        "tps": round(result.tps, 2),
        "target_calls": stats.target_calls,
        "finish_reason": stats.finish_reason,
    }


def emit(record: dict[str, Any]) -> None:
    """A record as it finishes: what was said, and how fast."""
    where = f"{Path(record['file']).name} [{record['window']}] " if "file" in record else ""
    print(f"{where}{record['method']}: {record['text']}")
    print(
        f"  {record['n_tokens']} tokens, decode {record['decode_s']:.2f} s after prefill "
        f"{record['prefill_s']:.2f} s, {record['tps']:.1f} tok/s, {record['target_calls']} target calls",
        flush=True,
    )


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """What every `--json FILE` writes: one indented JSON document (its folder made if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))


def progress(iterable, total: int, label: str):
    """A progress bar on stderr when there is more than one item."""
    if total <= 1:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=label, unit="window", file=sys.stderr, leave=False)
