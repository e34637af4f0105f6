"""`bench e2e`'s printed table, PNG and the CPU's instruction-set flags."""

from __future__ import annotations

import os
from pathlib import Path

REFERENCES = ("faster-whisper-int8-greedy", "faster-whisper-int8")  # the first present is the yardstick
# Like against like, as each system's users run it: (asyncspec's, its peer's); printed where both ran.
PAIRS = (
    ("as2d", "target"),
    ("as2d", "faster-whisper-int8-greedy"),
    ("beam5", "faster-whisper-int8-default"),
    ("batched", "faster-whisper-int8-batched"),
    ("beam5", "faster-whisper-int8-batched"),
)
# The flags that decide which encoder and GEMM paths are fast (bf16/int8 matrix units, vector widths).
ISA_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "vnni")


def cpu_flags() -> list[str]:
    """The CPU's vector and matrix instruction-set flags from /proc/cpuinfo (empty where absent)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return []
    line = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    flags = line.split(":", 1)[1].split() if ":" in line else []
    return sorted(flag for flag in flags if flag.startswith(ISA_PREFIXES))


def isa_environment() -> dict[str, str]:
    """Variables that cap or steer the math libraries (a run under ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI
    stands for a CPU without bf16; CT2_FORCE_CPU_ISA does the same for CTranslate2), so a report
    says which machine it actually measured."""
    prefixes = ("ONEDNN_", "DNNL_", "MKL_", "OMP_", "KMP_", "CT2_", "ATEN_CPU_", "FBGEMM_")
    return {key: value for key, value in sorted(os.environ.items()) if key.startswith(prefixes)}


def ratio_table(report: dict) -> str:
    """Per system: files, warm total (asyncspec's prefill and decode within it), load and warm-up
    (apart), the cold process wall (load and imports included), WER and the lowest per-file word
    recall, and warm and cold as multiples of faster-whisper int8 greedy's (below 1: faster)."""
    systems = report["systems"]
    name = next((n for n in REFERENCES if n in systems), None)
    reference = systems[name] if name else {}
    header = (
        f"{'system':28s} {'files':>5s} {'warm s':>7s} {'prefill':>7s} {'decode':>7s} {'load s':>6s} "
        f"{'cold s':>7s} {'WER %':>6s} {'recall':>6s} {'warm ×':>6s} {'cold ×':>6s}"
    )
    lines = [header, "-" * len(header)]
    for system, row in systems.items():
        lines.append(_row(system, row, reference))
    lines.append(f"× : against {name}" if name else "× : no faster-whisper int8 system ran")
    lines += pair_lines(systems)
    lines += _device_lines(report)
    return "\n".join(lines)


def pair_lines(systems: dict) -> list[str]:
    """Each pair of PAIRS that ran: warm and cold time as a multiple of the peer's, and WER apart."""
    lines = []
    for ours, theirs in PAIRS:
        if ours not in systems or theirs not in systems:
            continue
        mine, peer = systems[ours], systems[theirs]
        warm, cold_ratio = ratios(mine, peer)
        wer = (mine["wer"] - peer["wer"]) * 100 if mine["wer"] is not None and peer["wer"] is not None else None
        figures = [
            f"warm {warm:.3f}x" if warm is not None else "warm -",
            f"cold {cold_ratio:.3f}x" if cold_ratio is not None else "cold -",
            f"WER {wer:+.2f} points" if wer is not None else "WER -",
        ]
        lines.append(f"{ours} / {theirs}: " + ", ".join(figures))
    return lines


def _row(name: str, row: dict, reference: dict) -> str:
    def number(value, width: int, scale: float = 1.0, digits: int = 2) -> str:
        return f"{value * scale:{width}.{digits}f}" if value is not None else f"{'-':>{width}s}"

    cold = cold_wall(row)
    stages = " ".join(number(row.get(key), 7) for key in ("prefill_s", "decode_s"))
    warm_ratio, cold_ratio = ratios(row, reference)
    failed = row.get("cold", {}).get("returncode", 0)
    cold_column = f"{f'exit {failed}':>7s}" if failed else number(cold, 7)
    return (
        f"{name:28s} {len(row['files']):5d} {row['total_s']:7.2f} {stages} {row['load_s']:6.2f} {cold_column} "
        f"{number(row['wer'], 6, 100)} {number(row.get('recall_min'), 6, 100, 1)} {number(warm_ratio, 6)} "
        f"{number(cold_ratio, 6)}"
    )


def ratios(row: dict, reference: dict) -> tuple[float | None, float | None]:
    """(warm, cold) time of `row` as a multiple of `reference`'s; None where either is missing
    (a reference that did not run, a cold run that failed)."""
    warm = row["total_s"] / reference["total_s"] if reference.get("total_s") else None
    cold, reference_cold = cold_wall(row), cold_wall(reference)
    return warm, (cold / reference_cold if cold and reference_cold else None)


def cold_wall(row: dict) -> float | None:
    """The fresh process's wall, where it ran and exited 0 (a failed one has no time to compare)."""
    cold = row.get("cold", {})
    return cold.get("wall_s") if cold.get("returncode", 0) == 0 else None


def _device_lines(report: dict) -> list[str]:
    lines = []
    device = report["device"]
    lines.append(
        f"{cpu_name(device)}, {device['cores']} cores, {report['threads']} threads, "
        f"load {_load(device['load_average_before'])} -> {_load(device['load_average_after'])}"
    )
    lines.append("flags: " + " ".join(device["cpu_flags"]))
    if device["isa_environment"]:
        lines.append("environment: " + " ".join(f"{k}={v}" for k, v in device["isa_environment"].items()))
    return lines


def cpu_name(device: dict) -> str:
    """The CPU as a report names it: its model name and, where known, its family and model."""
    kind = device.get("cpu_kind")
    return f"{device['cpu']} ({kind})" if kind else device["cpu"]


def _load(average) -> str:
    return "/".join(f"{value:.2f}" for value in average)


def plot(report: dict, path: Path) -> None:
    """Left: seconds per file, one bar per system; right: the totals."""
    import numpy as np

    from asyncspec.plots import plt, save

    systems = report["systems"]
    names = list(systems)
    files = [Path(f["file"]).name for f in report["files"]]
    figure, (per_file, totals) = plt.subplots(
        1, 2, figsize=(14, 0.35 * len(files) * len(names) / 2 + 3), gridspec_kw={"width_ratios": [3, 1]}
    )
    height = 0.8 / len(names)
    rows = np.arange(len(files))
    for index, name in enumerate(names):
        seconds = [record["wall_s"] for record in systems[name]["files"]]
        per_file.barh(rows + index * height, seconds, height, label=name)
    per_file.set_yticks(rows + 0.4 - height / 2, files, fontsize=7)
    per_file.invert_yaxis()
    per_file.set_xlabel("seconds, audio file to text")
    per_file.legend(fontsize=8)
    columns = np.arange(len(names))
    colors = [f"C{i}" for i in range(len(names))]
    totals.bar(
        columns - 0.2, [systems[name]["total_s"] for name in names], 0.4, color=colors, label="warm (models loaded)"
    )
    cold = [cold_wall(systems[name]) or 0.0 for name in names]
    totals.bar(columns + 0.2, cold, 0.4, color=colors, alpha=0.45, hatch="//", label="cold (fresh process)")
    totals.set_xticks(columns, names)
    totals.legend(fontsize=8)
    totals.set_ylabel("total seconds")
    totals.tick_params(axis="x", rotation=45, labelsize=7)
    figure.suptitle(f"bench e2e: {report['model']}, {report['threads']} threads, {cpu_name(report['device'])}")
    save(figure, path)
