"""Which method a transcription decodes with: `auto` (the default) resolved on this machine, and
the method a window actually runs where its drafter cannot help (said in a note, never silent).

As²d's producer is a process of its own that needs a core. Where the machine has only two, that
core is half of what the target's encoder would use, and the encoder is about half a window's
time: measured on 2-core EPYCs, Whisper base's encoder took 1.12 s a window on one thread against
0.60 s on two (Zen 3, fp32), and on the eight-file long-form set As²d took 85.47 s against
target-only's 83.08 s (Zen 2, slower on 7 of 8 files). So `auto` runs As²d only where the producer
leaves the target at least two cores, and target-only elsewhere; `--method as2d` runs it anyway.
"""

from __future__ import annotations

from asyncspec.models.threads import available_cores

AUTO = "auto"
MIN_AS2D_CORES = 3  # the producer's core plus two for the target's encoder and decoder


def resolve_auto(
    methods: tuple[str, ...], cores: int | None = None, compare: bool = False
) -> tuple[tuple[str, ...], str | None]:
    """`methods` with `auto` replaced by the method it means on this machine (repeats dropped),
    and the line that says what it chose and why (None without `auto`). `compare`: the run checks
    its method against target-only, so auto means As²d whatever the cores (target-only against
    itself would check nothing)."""
    if AUTO not in methods:
        return methods, None
    cores = cores or available_cores()
    if cores >= MIN_AS2D_CORES:
        chosen, why = "as2d", f"its producer takes one of {cores} cores"
    elif compare:
        chosen, why = "as2d", "--compare checks it against target-only"
    else:
        chosen = "target"
        why = (
            f"As²d's producer would take one of this machine's {cores} cores, and the target's encoder "
            "loses more on the core than drafting saves; --method as2d runs it anyway"
        )
    resolved = tuple(dict.fromkeys(chosen if method == AUTO else method for method in methods))
    return resolved, f"method auto: {'As²d' if chosen == 'as2d' else 'target-only'} ({why})"


def runnable(method: str, options, producer_model: str, drafter_name: str) -> tuple[str, list[str]]:
    """The method a recording decodes with under `options` (LongformOptions), and the notes that say
    why where it is not `method`: target-only for batched decoding (the chunks take the rows), for a
    beam search (speculation verifies greedy decoding), or where the drafter is English-only and
    the speech is another language or a translation."""
    if options.batch_size is not None and method != "target":
        return "target", [
            f"{method}: batched decoding puts the chunks' own rows side by side in each call; "
            f"its {options.batch_size} chunks at a time are decoded target-only"
        ]
    if options.beam_size > 1 and method != "target":
        beams = options.beam_size
        return "target", [
            f"{method}: speculation verifies greedy decoding; a beam search of {beams} is decoded target-only"
        ]
    drafter = {"as2d": producer_model, "sd": drafter_name, "specasr": drafter_name}.get(method)
    english = options.language == "en" and options.task == "transcribe"
    if drafter is None or english or not drafter.endswith(".en"):
        return method, []
    what = "English speech" if options.task == "transcribe" else "English transcripts, not translations,"
    note = (
        f"{method}: its drafter {drafter} drafts {what} only; this {options.language} {options.task} "
        "is decoded target-only"
    )
    return "target", [note]
