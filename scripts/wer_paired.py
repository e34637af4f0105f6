"""Compare two transcriptions of the same recordings from `asyncspec bench e2e` results, with a
paired bootstrap interval for the WER difference (asyncspec.benchmarks.paired_wer).

    python scripts/wer_paired.py RUN_A/e2e.json RUN_B/e2e.json [--system-a target] [--system-b target]

A and B may be one file with two systems. Every recording with a reference in A must be in both,
with the same reference; otherwise it stops and says which.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asyncspec.benchmarks.paired_wer import compare


def transcriptions(result: dict, system: str) -> dict[str, str]:
    if system not in result["systems"]:
        sys.exit(f"no system {system!r} in the result (it has {', '.join(result['systems'])})")
    return {row["file"]: row["text"] for row in result["systems"][system]["files"]}


def references(result: dict) -> dict[str, str]:
    return {Path(row["file"]).name: row["transcript"] for row in result["files"] if row.get("transcript")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="bench e2e result JSON (transcription a)")
    parser.add_argument("b", type=Path, help="bench e2e result JSON (transcription b)")
    parser.add_argument("--system-a", default="target")
    parser.add_argument("--system-b", default="target")
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--out", type=Path, help="also write the comparison as JSON here")
    args = parser.parse_args()
    result_a, result_b = (json.loads(path.read_text()) for path in (args.a, args.b))
    refs, refs_b = references(result_a), references(result_b)
    texts_a, texts_b = transcriptions(result_a, args.system_a), transcriptions(result_b, args.system_b)
    missing = [name for name in refs if name not in texts_a or name not in texts_b or refs_b.get(name) != refs[name]]
    if missing or not refs:
        sys.exit(f"not comparable: {', '.join(missing) or 'no references'} missing or with another reference in B")
    paired = compare([(refs[n], texts_a[n], texts_b[n]) for n in refs], resamples=args.resamples)
    rows = []
    print(f"{'recording':<16} {'words':>6} {'errors a':>9} {'errors b':>9}")
    for name, (errors_a, errors_b, words) in zip(refs, paired.recordings, strict=True):
        rows.append({"file": name, "words": words, "errors_a": errors_a, "errors_b": errors_b})
        print(f"{name:<16} {words:>6} {errors_a:>9} {errors_b:>9}")
    print(
        f"WER a {100 * paired.errors_a / paired.words:.2f} %, b {100 * paired.errors_b / paired.words:.2f} %: "
        f"b - a = {100 * paired.difference:+.2f} points, 95 % interval [{100 * paired.low:+.2f}, "
        f"{100 * paired.high:+.2f}] over {paired.units} reference lines; b worse in "
        f"{100 * paired.b_worse_share:.1f} % of {args.resamples} resamples"
    )
    if args.out:
        summary: dict[str, object] = {"a": f"{args.a}:{args.system_a}", "b": f"{args.b}:{args.system_b}"}
        summary["files"] = rows
        summary |= {"difference": paired.difference, "interval_95": [paired.low, paired.high]}
        summary |= {"units": paired.units, "b_worse_share": paired.b_worse_share, "resamples": args.resamples}
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
