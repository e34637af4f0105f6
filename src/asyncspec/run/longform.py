"""Long-form runs side by side: every method's windows against target-only's, window by window
(seek, prompt and tokens, timestamps included), as records the summary table pools."""

from __future__ import annotations

import sys
from itertools import zip_longest
from typing import Any

from asyncspec.exactness import ExactnessCheck
from asyncspec.run.summary import REFERENCE, comparison_records
from asyncspec.transcription.api import TranscriptionInfo
from asyncspec.transcription.segments import Segment


def stream_segments(segments, info: TranscriptionInfo, label: str, echo: bool) -> list[Segment]:
    """Consume a transcription's segments: each one's text on stdout as it arrives (when `echo`),
    progress on stderr, one line per window."""
    kept, windows_seen = [], 0
    if info.options.language is not None and info.language_probability < 1.0:
        print(f"{label}: detected language {info.language} (p = {info.language_probability:.2f})", file=sys.stderr)
    for note in info.notes:
        print(f"{label}: note: {note}", file=sys.stderr)
    if info.duration_after_vad is not None:  # what VAD removed is said, not silently dropped
        removed = info.duration - info.duration_after_vad
        print(f"{label}: VAD kept {info.duration_after_vad:.1f} s of speech, removed {removed:.1f} s", file=sys.stderr)
    for segment in segments:
        kept.append(segment)
        if echo:
            print(segment.text.strip(), flush=True)
        windows_seen = _progress(info, label, windows_seen)
    _progress(info, label, windows_seen)
    if info.stats.producer_failure:  # the output is still exact: the target decoded on alone
        print(f"{label}: note: As²d's producer failed ({info.stats.producer_failure})", file=sys.stderr)
    return kept


def _progress(info: TranscriptionInfo, label: str, seen: int) -> int:
    for outcome in info.windows[seen:]:
        done = min(outcome.end_s, info.duration)
        notes = " (silent, skipped)" if outcome.skipped else ""
        notes += f" (fell back to T={outcome.chosen.temperature:g})" if outcome.fell_back else ""
        if outcome.resumed_early:  # Whisper's rule would have skipped the rest of this window as silent
            notes += f" (its text ended early: the next window starts at {outcome.next_start_s:.1f} s)"
        print(f"{label} [{info.method}]: {done:.1f} / {info.duration:.1f} s{notes}", file=sys.stderr, flush=True)
    return len(info.windows)


def window_records(path: str, infos: dict[str, TranscriptionInfo], target, compared: bool) -> list[dict[str, Any]]:
    """A record per method and window; with target-only run beside it, `equal_to_target` says
    whether the window of the same index was decoded the same way (`windows_equal`)."""
    records = []
    reference = infos.get(REFERENCE) if compared else None
    for method, info in infos.items():
        for index, outcome in enumerate(info.windows):
            context = {"file": str(path), "window": index, "start_s": outcome.start_s}
            record = comparison_records([outcome.chosen.result], target, False, **context)[0]
            if reference is not None:
                twin = reference.windows[index] if index < len(reference.windows) else None
                record["equal_to_target"] = twin is not None and windows_equal(twin, outcome)
            record |= {
                "method": method,
                "method_run": info.method,  # target-only where the method could not draft this speech
                "language": info.language,
                "temperature": outcome.chosen.temperature,
                "fell_back": outcome.fell_back,
                "skipped": outcome.skipped,
                "segments": len(outcome.segments),
            }
            records.append(record)
    return records


def check_windows(check: ExactnessCheck, path: str, method: str, reference: TranscriptionInfo, info: TranscriptionInfo):
    """Every window of `method` against target-only's: the same seek and prompt, and every decode
    tried there (a greedy attempt that fell back is compared too, not only the one kept). After the
    first difference the windows no longer decode the same audio, so the rest is one mismatch."""
    for index, (expected, got) in enumerate(zip_longest(reference.windows, info.windows)):
        where = f"{path} window {index}"
        if expected is None or got is None:
            present = expected or got
            tokens = present.chosen.result.tokens
            check.check(where, method, present.chosen.request, tokens if got is None else [], tokens if got else [])
            return
        if not _same_window(check, where, method, expected, got):
            return


def _same_window(check: ExactnessCheck, where: str, method: str, expected, got) -> bool:
    same_input = _same_input(expected, got)
    for attempt, (want, have) in enumerate(zip_longest(expected.attempts, got.attempts)):
        reference = want or expected.attempts[-1]
        tokens = have.result.tokens if have is not None and same_input else [-1]
        label = where if attempt == 0 else f"{where} (fallback attempt {attempt}, T={reference.temperature:g})"
        if not check.check(label, method, reference.request, reference.result.tokens if want else [], tokens):
            return False
    return True


def _same_input(expected, got) -> bool:
    """Both windows start at the same seek with the same prompt (previous text included)."""
    return (expected.seek, expected.chosen.request.prompt_ids) == (got.seek, got.chosen.request.prompt_ids)


def windows_equal(expected, got) -> bool:
    """The same window decoded the same way: seek, prompt and every attempt's tokens."""
    attempts = [a.result.tokens for a in expected.attempts] == [a.result.tokens for a in got.attempts]
    return _same_input(expected, got) and attempts
