"""Arguments of `profile`, `replay` and `select-budget`, kept free of heavy imports so that
building the parser (every CLI call) stays fast."""

from __future__ import annotations

from asyncspec.profiling.costs import DEFAULT_OFFSETS, DEFAULT_WIDTHS
from asyncspec.profiling.deployed import CATALOG, config_path
from asyncspec.run.options import add_dtype_option

MAX_BUDGET = 24
# How many times select-budget collects the development split by default (each entry is charged,
# per window, its slowest replay over them: profiling/generalising.py). Measured: on a 2-core AMD EPYC
# (family 26) two collections of the same windows gave the autoregressive producer spans 0.88-1.65x
# apart, and charging it as collected once chose a configuration at 44 % of the oracle on the test
# windows. On a family-25 EPYC two collections agreed within 1 %, and a fixed 1.25x slowdown charged
# in their place chose the other producer: 65 % of the oracle there. So the variation is measured.
COLLECTIONS = 2


PROFILE_HELP = "measure this device's verification and loop costs"


def add_profile(profile) -> None:
    profile.add_argument("--model", default="whisper-base")
    profile.add_argument("--producer", default="ct2-chunk@4s", help="producer for the concurrent sweep and loop costs")
    profile.add_argument("--producer-model", default="whisper-tiny.en")
    profile.add_argument("--drafter", default="whisper-tiny.en", help="sd drafter whose step cost is measured")
    add_dtype_option(profile)
    profile.add_argument("--max-width", type=int, default=max(DEFAULT_WIDTHS), help="widths K = 1..this")
    profile.add_argument("--offsets", default=",".join(map(str, DEFAULT_OFFSETS)), help="output tokens before calls")
    profile.add_argument("--repetitions", type=int, default=5)
    profile.add_argument("--warmup", type=int, default=1)
    profile.add_argument("--idle-only", action="store_true", help="skip the sweep beside a running producer")
    profile.add_argument("--threads", type=int, default=1)
    profile.add_argument("--out", default="out", help="folder for profile.json and profile_saving.png")


REPLAY_HELP = "re-price saved runs under a cost profile; --validate vs native"


def add_replay(replay) -> None:
    replay.add_argument("trajectories", nargs="?", help="trajectory JSON (from bench ondevice / select-budget)")
    replay.add_argument("--profile", help="cost profile JSON (validate: default measures one now)")
    replay.add_argument("--validate", action="store_true", help="native As²d vs replay of the same trajectories")
    replay.add_argument("--audio", metavar="DIR", help="validate: audio directory (default: joined LibriVox)")
    replay.add_argument("--model", default="whisper-base")
    replay.add_argument("--producer", default="ct2-chunk@4s")
    replay.add_argument("--producer-model", default="whisper-tiny.en")
    replay.add_argument("--drafter", default="whisper-tiny.en")
    # As²d's DEFAULT_BUDGET (decoding/as2d.py, which imports torch: not here); a test holds them equal
    replay.add_argument("--budget", type=int, default=7, help="validate: As²d budget (its default)")
    replay.add_argument(
        "--calibrate-every",
        type=int,
        default=0,
        help="validate: re-measure call costs after every N windows and price each block with the costs "
        "measured just before and just after it, pooled (0: one profile, measured before the first)",
    )
    replay.add_argument(
        "--repeats", type=int, default=3,
        help="validate: run every window this many times and compare medians (one run is one draw of the "
        "machine's speed)",
    )  # fmt: skip
    add_dtype_option(replay)
    replay.add_argument("--threads", type=int, default=1)
    replay.add_argument("--out", default="out")
    replay.add_argument("--json", metavar="FILE", help="write the report here (default: OUT/replay*.json)")


SELECT_BUDGET_HELP = "choose As²d's producer and budget on a development split"


def add_select_budget(select) -> None:
    select.add_argument(
        "--audio", metavar="DIR", help="development audio (default: the split --split names, assembled here)"
    )
    select.add_argument(
        "--split",
        choices=["real", "festival"],
        default="real",
        help="the development split: real (the CMU recordings and LibriVox pairs at two other rates than the "
        "recorded one, the default) or festival "
        "(Pride and Prejudice in Festival's voices)",
    )
    select.add_argument(
        "--secondary", choices=["festival", "none"], default="none",
        help="also collect the Festival split and report how its ranking compares (Spearman's rho)",
    )  # fmt: skip
    select.add_argument("--profile", help="cost profile JSON (default: measure one now, widths 1..25)")
    select.add_argument("--producers", default=CATALOG, help="catalog: ct2-chunk@<s>s and/or autoregressive")
    select.add_argument("--max-budget", type=int, default=MAX_BUDGET)
    select.add_argument(
        "--collections", type=int, default=COLLECTIONS,
        help="collect the split this many times; each entry is charged per window its slowest replay",
    )  # fmt: skip
    select.add_argument("--model", default="whisper-base")
    select.add_argument("--producer-model", default="whisper-tiny.en")
    select.add_argument("--drafter", default="whisper-tiny.en")
    add_dtype_option(select)
    select.add_argument("--threads", type=int, default=1)
    select.add_argument("--out", default="out")
    select.add_argument("--config", help=f"where to write the deployed configuration (default: {config_path()})")
