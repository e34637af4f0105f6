"""`bench e2e`'s printed table, PNG and the CPU's instruction-set flags."""

from __future__ import annotations

import os
from pathlib import Path

REFERENCE = "faster-whisper-int8"
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
    prefixes = ("ONEDNN_", "DNNL_", "MKL_", "OMP_", "KMP_", "CT2_", "ATEN_CPU_")
    return {key: value for key, value in sorted(os.environ.items()) if key.startswith(prefixes)}


def ratio_table(report: dict) -> str:
    """Per system: files, total seconds (asyncspec's prefill and decode within it), load and warm-up
    (apart), WER, and the total as a multiple of faster-whisper int8's on the same files (below 1:
    faster than it)."""
    systems = report["systems"]
    reference = systems.get(REFERENCE, {}).get("total_s")
    header = (
        f"{'system':24s} {'files':>5s} {'total s':>8s} {'prefill':>8s} {'decode':>8s} {'load s':>7s} "
        f"{'warm-up':>7s} {'WER %':>6s} {'× fw-int8':>9s}"
    )
    lines = [header, "-" * len(header)]
    for name, row in systems.items():
        wer = f"{100 * row['wer']:6.2f}" if row["wer"] is not None else f"{'-':>6s}"
        ratio = f"{row['total_s'] / reference:9.2f}" if reference else f"{'-':>9s}"
        stages = " ".join(f"{row[key]:8.2f}" if key in row else f"{'-':>8s}" for key in ("prefill_s", "decode_s"))
        lines.append(
            f"{name:24s} {len(row['files']):5d} {row['total_s']:8.2f} {stages} {row['load_s']:7.2f} "
            f"{row['warmup_s']:7.2f} {wer} {ratio}"
        )
    device = report["device"]
    lines.append(
        f"{device['cpu']}, {device['cores']} cores, {report['threads']} threads, "
        f"load {_load(device['load_average_before'])} -> {_load(device['load_average_after'])}"
    )
    lines.append("flags: " + " ".join(device["cpu_flags"]))
    if device["isa_environment"]:
        lines.append("environment: " + " ".join(f"{k}={v}" for k, v in device["isa_environment"].items()))
    return "\n".join(lines)


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
    totals.bar(names, [systems[name]["total_s"] for name in names], color=[f"C{i}" for i in range(len(names))])
    totals.set_ylabel("total seconds (load apart)")
    totals.tick_params(axis="x", rotation=45, labelsize=7)
    figure.suptitle(f"bench e2e: {report['model']}, {report['threads']} threads, {report['device']['cpu']}")
    save(figure, path)
