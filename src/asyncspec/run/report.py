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
    say(f"{where}{record['method']}: {record['text']}")
    say(
        f"  {record['n_tokens']} tokens, decode {record['decode_s']:.2f} s after prefill "
        f"{record['prefill_s']:.2f} s, {record['tps']:.1f} tok/s, {record['target_calls']} target calls"
    )


def say(line: str) -> None:
    """A line on stdout that never lands on the line of a progress bar (which is on stderr): the bar
    steps aside, the line is printed, the bar is drawn again below it."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """What every `--json FILE` writes: one indented JSON document (its folder made if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))


def progress(iterable, total: int, label: str):
    """A progress bar on stderr when there is more than one item. The finished bar stays, ending
    its line, so whatever is printed next (a summary table) starts on a line of its own."""
    if total <= 1:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=label, unit="window", file=sys.stderr)
