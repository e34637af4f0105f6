"""Shared output: one JSON object per window and method, and a human-readable line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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


def emit(record: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(record), flush=True)
        return
    where = f"{Path(record['file']).name} [{record['window']}] " if "file" in record else ""
    print(f"{where}{record['method']}: {record['text']}")
    print(
        f"  {record['n_tokens']} tokens, decode {record['decode_s']:.2f} s after prefill "
        f"{record['prefill_s']:.2f} s, {record['tps']:.1f} tok/s, {record['target_calls']} target calls",
        flush=True,
    )


def progress(iterable, total: int, label: str):
    """A progress bar on stderr when there is more than one item."""
    if total <= 1:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=label, unit="window", file=sys.stderr, leave=False)
