"""The invariance self-test: on this CPU, dtype and thread count, are a row's logits and KV bitwise
independent of the call that computed them?

Speculative output equals target-only output only if they are (models/fixed_shape.py). Kernels
differ between machines (AMX, avx512_bf16, neither) and between instruction-set caps, so this is
checked where the target runs, never assumed: a few calls decode one token sequence one token
at a time, in blocks of the full width, in uneven blocks, and across a rollback, and compare every
row's logits and every position's keys/values bit for bit. The verdict is cached per machine
(CPU model and flags, ISA caps, torch version, threads, model, dtype, call shape).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from asyncspec.errors import InputError
from asyncspec.models.base import DecodeRequest, DecoderState, call_width
from asyncspec.models.batch_check import batch_check
from asyncspec.models.cache_entries import entry_path, write_entry
from asyncspec.models.call_stacks import stack_sizes
from asyncspec.models.int8_linear import Int8Linear, products_exact
from asyncspec.models.machine import cpu_identity
from asyncspec.models.narrow_check import full_width, narrow_check
from asyncspec.models.row_probe import compare_rows, kv_rows, probe_tokens
from asyncspec.models.threads import torch_threads

ISA_VARIABLES = (
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "ATEN_CPU_CAPABILITY",
    "FBGEMM_ENABLE_INSTRUCTIONS",
)
EXTRA_TOKENS = 3  # the probe sequence is one full block plus this many tokens
PROMPT_LEN = 4


@dataclass(frozen=True)
class InvarianceReport:
    passed: bool
    rows_checked: int
    rows_differing: int
    kv_positions_differing: int
    first_difference: str  # "" when passed
    engine: str
    dtype: str
    threads: int
    width: int | None
    seconds: float
    cached: bool = False
    # The same calls run at this other thread count too (None: not checked), and whether every row
    # and KV position came out equal to `threads`' own: then the target may switch between the two.
    wide_threads: int | None = None
    wide_equal: bool | None = None
    # The batch check (None: not run): blocks computed in stacked calls of 2, 4, ... up to
    # `stacked_blocks` blocks, and whether every row and KV position came out equal to the block's
    # own call's: then requests' blocks may share one wide call (KVBackend.extend_stacked).
    stacked_blocks: int | None = None
    stacked_equal: bool | None = None
    stacked_difference: str = ""  # the first difference, "" when equal
    # The largest stack whose calls, and every smaller stack's, were all equal (0: none; kernels
    # may block a wide call differently only past some width: AMX bf16 at 64 rows, 2026-12-04).
    stacked_proven: int = 0
    stacked_seconds: float = 0.0  # the batch check's part of `seconds`
    # The thread counts the batch check ran at: `threads`, and `wide_threads` where that was checked
    # (a transcriber's fallback draws stack at whichever count it decodes with then).
    stacked_threads: tuple[int, ...] = ()
    # The narrow check (narrow_check.py): decoding widths below `width` whose calls gave every row
    # and KV position bitwise the full-width calls' at each of `narrow_threads`; the engine runs a
    # short call at the narrowest of them that holds its rows (FixedShapeEngine.decoding_width).
    narrow_widths: tuple[int, ...] = ()
    narrow_threads: tuple[int, ...] = ()
    narrow_difference: str = ""  # the first width found different, "" when all were equal

    def summary(self) -> str:
        verdict = "passed" if self.passed else f"FAILED ({self.first_difference})"
        wide = ""
        if self.wide_threads is not None:
            wide = f"; at {self.wide_threads} threads {'equal' if self.wide_equal else 'DIFFERENT'}"
        return (
            f"invariance self-test {verdict}: {self.engine} engine, {self.dtype}, width {self.width}, "
            f"{self.threads} thread(s), {self.rows_checked} rows compared bitwise{wide}{self._stacked_summary()}"
            f"{self._narrow_summary()}"
        )

    def _narrow_summary(self) -> str:
        if not self.narrow_threads:
            return ""
        widths = ", ".join(map(str, self.narrow_widths))
        equal = f"; narrower calls of {widths} rows equal" if widths else ""
        return equal + (f"; {self.narrow_difference}" if self.narrow_difference else "")

    def narrowing(self, threads: int) -> tuple[int, ...]:
        """The narrower decoding widths proven at `threads` (none where the verdict failed)."""
        proven = self.passed and threads in self.narrow_threads
        return tuple(self.narrow_widths) if proven else ()

    def _stacked_summary(self) -> str:
        if self.stacked_blocks is None:
            return ""
        if self.stacked_equal:
            return f"; stacked calls of {stack_list(self.stacked_blocks)} blocks equal"
        equal = f"{stack_list(self.stacked_proven)} blocks equal, " if self.stacked_proven >= 2 else ""
        differing = stack_list(self.stacked_blocks or 0, above=self.stacked_proven)
        return f"; stacked calls of {equal}of {differing} blocks DIFFERENT ({self.stacked_difference})"

    def stacking(self, threads: int) -> int:
        """The most blocks one call may stack at `threads` (1: one call per request)."""
        checked = threads in (self.stacked_threads or (self.threads,))
        proven = self.passed and self.may_use(threads) and checked and self.stacked_proven >= 2
        return self.stacked_proven if proven else 1

    def may_use(self, threads: int) -> bool:
        """Whether rows decoded at `threads` equal rows decoded at the checked count."""
        return threads == self.threads or (threads == self.wide_threads and bool(self.wide_equal))


def stack_list(most_blocks: int, above: int = 0) -> str:
    """The stack sizes up to `most_blocks` (past `above`), as the reports print them: "2, 4, 8"."""
    return ", ".join(str(n) for n in stack_sizes(most_blocks) if n > above)


def probe_state(backend) -> DecoderState:
    """A state holding the probe prompt (over the probe context, for an encoder-decoder model)."""
    context = backend.probe_context() if hasattr(backend, "probe_context") else None
    return _fresh_state(backend, probe_prompt(backend), context)


def _fresh_state(backend, prompt: list[int], context) -> DecoderState:
    if not hasattr(backend, "prefill_tokens"):  # any other Decoder: through its public interface
        return backend.prefill(DecodeRequest(tuple(prompt)))
    state = backend._new_state(len(prompt), context)
    if context is not None:
        state.extras["encoded"] = context
    backend.prefill_tokens(state, prompt, len(prompt))
    return state


def _decode_in_blocks(backend, prompt, context, tokens, sizes, detour: int = 0) -> tuple[torch.Tensor, DecoderState]:
    """Logits [len(tokens), V] computed in calls of the given sizes; with a detour, `detour` wrong
    tokens are extended and rolled back first (their KV must leave no trace)."""
    state = _fresh_state(backend, prompt, context)
    if detour:
        backend.extend(state, [(t + 1) % backend.vocab_size for t in tokens[:detour]])
        backend.rollback(state, len(prompt))
    rows, done = [], 0
    for size in sizes:
        rows.append(backend.extend(state, tokens[done : done + size]))
        done += size
    return torch.cat(rows), state


def partitions(width: int, n: int) -> list[list[int]]:
    """Call sizes that put every token at several row indices of a call."""
    uneven, total, size = [], 0, 1
    while total < n:
        step = min(size, n - total, width)
        uneven.append(step)
        total, size = total + step, size + 1
    return [[width, n - width], uneven]


def inexact_int8_shapes(backend) -> list[tuple[int, int]]:
    """The [N, K] shapes of the backend's int8 linears whose integer products are not exact on
    this CPU (a kernel that saturates or rounds): their rows could still agree between calls
    while computing another model, so the check is on the integers themselves."""
    if getattr(backend, "output_int8", None) is None:
        return []
    modules = [backend.output_int8, *backend._decoder_layers().modules()]
    shapes = sorted({(m.out_features, m.in_features) for m in modules if isinstance(m, Int8Linear)})
    return [(n, k) for n, k in shapes if not products_exact(k, n)]


@torch.inference_mode()
def _equal_at_threads(backend, threads: int, prompt, context, tokens, reference, reference_kv) -> bool:
    """Every partition's rows and KV, decoded at `threads`, equal to the reference's."""
    width, n = call_width(backend) or 8, len(tokens)
    with torch_threads(threads):
        for sizes in [[1] * n, *partitions(width, n)]:
            logits, state = _decode_in_blocks(backend, prompt, context, tokens, sizes)
            if any(compare_rows(reference, reference_kv, logits, state, n)):
                return False
    return True


@torch.inference_mode()
def check_invariance(backend, wide_threads: int | None = None, stacked_blocks: int | None = None) -> InvarianceReport:
    """The verdict at the current thread count; with `wide_threads`, also whether the same calls at
    that count give the same bits (a target that decodes on more cores once it is alone); with
    `stacked_blocks`, the batch check (`stacked_difference`); and the narrow check. Every call but
    the narrow check's runs at the engine's full width."""
    with full_width(getattr(backend, "engine", None)):
        return _check_invariance(backend, wide_threads, stacked_blocks)


def _check_invariance(backend, wide_threads: int | None, stacked_blocks: int | None) -> InvarianceReport:
    started = time.perf_counter()
    inexact = inexact_int8_shapes(backend)
    width = call_width(backend) or 8
    n = width + EXTRA_TOKENS
    prompt = probe_prompt(backend)
    context = backend.probe_context() if hasattr(backend, "probe_context") else None
    tokens = probe_tokens(backend, n)
    reference, reference_state = _decode_in_blocks(backend, prompt, context, tokens, [1] * n)
    reference_kv = kv_rows(reference_state)
    references = (reference, reference_kv)
    wide = wide_threads if wide_threads is not None and wide_threads != torch.get_num_threads() else None
    rows_differing, kv_differing, first = 0, 0, ""
    for index, sizes in enumerate(partitions(width, n)):
        logits, state = _decode_in_blocks(backend, prompt, context, tokens, sizes, detour=width if index else 0)
        differing, kv = compare_rows(reference, reference_kv, logits, state, n)
        rows_differing += len(differing)
        kv_differing += len(kv)
        if (differing or kv) and not first:
            first = _describe(sizes, differing, reference, logits)
    if inexact:
        first = f"int8 products are not exact on this CPU at {inexact[0][0]}x{inexact[0][1]}; " + first
    return InvarianceReport(
        passed=rows_differing == 0 and kv_differing == 0 and not inexact,
        rows_checked=n * len(partitions(width, n)),
        rows_differing=rows_differing,
        kv_positions_differing=kv_differing,
        first_difference=first,
        engine=getattr(backend, "engine_name", type(backend).__name__),
        dtype=getattr(backend, "precision", str(getattr(backend, "dtype", "")).removeprefix("torch.")),
        threads=torch.get_num_threads(),
        width=call_width(backend),
        seconds=round(time.perf_counter() - started, 3),
        wide_threads=wide,
        wide_equal=None if wide is None else _equal_at_threads(backend, wide, prompt, context, tokens, *references),
        **batch_check(backend, context, stacked_blocks, wide),
        **narrow_check(backend, partial(_decode_in_blocks, backend, prompt, context, tokens), references, wide),
    )


def _describe(sizes, differing, reference, logits) -> str:
    if not differing:
        return f"calls of {sizes}: logits equal but keys/values differ"
    row = differing[0]
    delta = (logits[row] - reference[row]).abs().nan_to_num(0.0).max().item()
    return f"calls of {sizes}: row {row} differs from one-token calls by up to {delta:.3g}"


def probe_prompt(backend) -> list[int]:
    """A prompt whose prefilled head spans two prefill blocks: a prompt block's rows attend in one
    masked product (`fixed_shape.attend_prompt`), whose bits the wide thread count must reproduce
    at the lengths a long-form window's previous text brings, not only at a three-token prompt."""
    engine = getattr(backend, "engine", None)
    span = (engine.shape.prefill_width if engine is not None else 0) + PROMPT_LEN
    prompt_ids = getattr(backend, "prompt_ids", None)
    if callable(prompt_ids):
        text_end = backend.timestamp_rules.eot  # Whisper: ids below it are text
        return list(prompt_ids(previous=[token % text_end for token in probe_tokens(backend, span)]))
    return probe_tokens(backend, span + 1)[1:]


# ------------------------------------------------------------------ the verdict, cached per machine


# Bumped when the engine's arithmetic or the report's fields change, so that a verdict cached for
# other arithmetic is measured again (2: cross-attention with the rows as columns; partial stacks;
# 3: packed stacks, the batch check at the wide thread count too; 4: a probe prompt of two prefill
# blocks, attended by attend_prompt; 5: a stacked call's cross-attention one block at a time; 6: the
# int8 engine's cross-attention weighted sums in integers; 7: prompt blocks fitted to the prompt,
# Whisper's up to 128 rows; 8: the narrow check; 9: narrow widths for int8 alone, a float
# engine's revision-8 verdict could carry widths its real rows did not keep; 10: FBGEMM's int8
# linears and fp32 products of the cross-attention's integer codes; 11: int8 Whisper's one-request
# calls through the TorchScript graph, models/scripted_step.py; 12: narrow calls at every width
# below the engine's, not only powers of two).
VERDICT_REVISION = 12


def machine_identity() -> dict:
    """What a per-machine measurement depends on besides the model: CPU model and flags, ISA caps,
    torch version and threads."""
    return {
        "cpu": cpu_identity(),
        "isa_caps": {name: os.environ.get(name, "") for name in ISA_VARIABLES},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def machine_key(backend) -> dict:
    return machine_identity() | {
        "model": backend.name,
        "weights": _weights_fingerprint(backend),
        "dtype": _precision_key(backend),
        "engine": backend.engine_name,
        "shape": None if backend.engine is None else asdict(backend.engine.shape),
    }


def _precision_key(backend) -> str:
    """int8 targets by their weight range too (7-bit weights on a CPU whose full range saturates)."""
    if getattr(backend, "precision", "") != "int8":
        return str(backend.dtype)
    from asyncspec.models.int8_linear import weight_range

    return f"int8/w{weight_range()}"


def _weights_fingerprint(backend) -> str:
    weight = backend._output_weight()
    return hashlib.sha256(weight[:8].detach().float().numpy().tobytes()).hexdigest()[:16]


def _cache_file(key: dict) -> Path:
    return entry_path("selftest", key)


def invariance(
    backend, use_cache: bool = True, wide_threads: int | None = None, stacked_blocks: int | None = None
) -> InvarianceReport:
    """The backend's verdict: from this process, from the per-machine cache, or measured now (with
    `wide_threads`, one that also compared that thread count; with `stacked_blocks`, one that also
    ran the batch check up to that many blocks; fewer than 2 ask for none)."""
    stacked_blocks = stacked_blocks if stacked_blocks is not None and stacked_blocks >= 2 else None
    known = getattr(backend, "invariance", None)
    if known is not None and _answers(known, wide_threads, stacked_blocks):
        return known
    cacheable = use_cache and hasattr(backend, "_output_weight")  # a verdict is cached per model weights
    asked = {"wide_threads": wide_threads, "stacked_blocks": stacked_blocks}
    extra = {name: value for name, value in asked.items() if value is not None} | {"revision": VERDICT_REVISION}
    path = _cache_file(machine_key(backend) | extra) if cacheable else None
    report = _read_cached(path)
    if report is None:
        report = check_invariance(backend, wide_threads, stacked_blocks)
        if path is not None:
            write_entry(path, asdict(report))
    backend.invariance = report
    engine = getattr(backend, "engine", None)
    if engine is not None and hasattr(engine, "narrow"):
        engine.narrow = {count: report.narrowing(count) for count in report.narrow_threads}
    return report


def _answers(known: InvarianceReport, wide_threads: int | None, stacked_blocks: int | None) -> bool:
    """Whether a verdict already covers what is asked."""
    wide = wide_threads is None or wide_threads in (known.threads, known.wide_threads)
    stacked = stacked_blocks is None or (known.stacked_blocks or 0) >= stacked_blocks
    return wide and stacked


def _read_cached(path: Path | None) -> InvarianceReport | None:
    if path is None or not path.is_file():
        return None
    try:
        fields = json.loads(path.read_text())
        return InvarianceReport(**{**fields, "cached": True})
    except (ValueError, TypeError):
        return None  # a damaged cache entry is measured again


def require_invariant(target, method: str, stacked_blocks: int | None = None) -> InvarianceReport:
    """Refuse a speculative method on a target whose rows depend on the call's shape: its output
    could differ from target-only output, and that is never done silently. The verdict (with the
    batch check up to `stacked_blocks` blocks, if asked) is returned."""
    report = invariance(target, stacked_blocks=stacked_blocks)
    if not report.passed:
        raise InputError(
            f"{method} refused: {report.summary()}. On this machine the target's rows depend on the "
            "call that computes them, so speculative output could differ from target-only output. "
            "Use --method target, or another --dtype or --threads whose self-test passes."
        )
    return report
