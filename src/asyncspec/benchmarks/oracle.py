"""`bench ondevice --oracle`: keep each test window's trajectories (the bench's own As²d run plus
one run per other catalog producer) and report the deployed configuration against the
per-window oracle under a cost profile (seed 000 App. D.4.3)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from asyncspec.decoding.as2d import DEFAULT_BUDGET
from asyncspec.decoding.methods import METHODS
from asyncspec.decoding.result import DecodeConfig
from asyncspec.errors import InputError
from asyncspec.profiling.collect import Collection, add_producer_run, producers
from asyncspec.profiling.costs import CostProfile
from asyncspec.profiling.deployed import ProducerChoice, current_deployment, parse_catalog
from asyncspec.profiling.headroom import headroom
from asyncspec.profiling.selection import Entry, ensure_disjoint
from asyncspec.profiling.trajectory import fingerprint, reference_trajectory, save_trajectories
from asyncspec.run.options import DecodingOptions


class Headroom:
    """Inert unless args.oracle; then a context manager owning the extra producer workers."""

    def __init__(self, args, options: DecodingOptions):
        """Checks everything it needs before any model is loaded."""
        self.options, self.enabled = options, bool(getattr(args, "oracle", False))
        self.out = Path(args.out)
        self.collection, self.stack = Collection(), ExitStack()
        if not self.enabled:
            return
        if "as2d" not in options.methods:
            raise InputError("--oracle needs the as2d method")
        self.deployed = current_deployment().config  # one made on another CPU was not used
        self.profile_path = args.profile or (self.deployed.development.get("profile") if self.deployed else None)
        if not self.profile_path or not Path(self.profile_path).exists():
            raise InputError("--oracle needs a cost profile: run `asyncspec profile` or `select-budget`, or --profile")
        self.profile = CostProfile.load(self.profile_path)
        self.choices = parse_catalog(args.catalog)

    def start(self, target) -> Headroom:
        """Open the other catalog producers' workers for this target."""
        self.target = target
        if not self.enabled:
            return self
        options = self.options
        self.own = ProducerChoice(options.producer, options.chunk_s).name
        self.budget = options.as2d_budget or DEFAULT_BUDGET
        self.catalog = [c.name for c in self.choices]
        others = [c for c in self.choices if c.name != self.own]
        self.workers = self.stack.enter_context(producers(others, options.producer_model, options.dtype, self.target))
        return self

    def __enter__(self) -> Headroom:
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def observe(self, dataset: str, name: str, samples, results, exactness=None) -> None:
        """Keep the window's trajectories; the other producers' As²d runs are checked against
        target-only by `exactness` (the bench's own runs were checked already)."""
        if not self.enabled:
            return
        if self.deployed:
            ensure_disjoint(self.deployed, [fingerprint(samples)])
        request = self.target.request(samples)
        reference = next(r for r in results if r.method == "target")
        trajectory = reference_trajectory(name, dataset, samples, self.target, reference, request)
        for serial in (r for r in results if r.method in ("sd", "specasr") and r.tokens == reference.tokens):
            trajectory.add_native(serial.method, serial)  # re-priced by `asyncspec replay`
        own = next(r for r in results if r.method == "as2d")
        add_producer_run(self.collection, trajectory, self.own, own, self.budget, own.tokens == reference.tokens)
        for producer, worker in self.workers.items():
            result = METHODS["as2d"](self.target, worker, request, DecodeConfig(budget=self.budget))
            equal = result.tokens == reference.tokens
            if exactness is not None:
                equal = exactness.check(
                    f"{dataset} {name}", f"as2d ({producer})", request, reference.tokens, result.tokens
                )
            add_producer_run(self.collection, trajectory, producer, result, self.budget, equal)
        self.collection.trajectories.append(trajectory)

    def report(self) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        trajectories = self.collection.trajectories
        save_trajectories(self.out / "bench_ondevice_trajectories.json", trajectories)
        catalog = sorted(set(self.catalog) | {self.own})
        report = headroom(trajectories, self.profile, catalog, Entry(self.own, self.budget))
        native = self.collection.native.get(f"as2d:{self.own}", [])
        native_tps = sum(len(r.tokens) for r in native) / sum(r.stats.decode_s for r in native)
        report.update(
            native_deployed_pooled_tps=round(native_tps, 3),
            native_deployed_ratio=round(native_tps / report["pooled_tps"], 4),
            selected_by="select-budget" if self.deployed else "defaults (no select-budget run)",
            profile=str(self.profile_path),
            mismatches=self.collection.mismatches,
        )
        return report


def plot_headroom(report: dict[str, Any], path: Path) -> None:
    """Per test window: the per-window oracle's replay TPS against the deployed configuration's."""
    from asyncspec.plots import plt, save

    rows = report["per_window"]
    x = range(len(rows))
    figure, axis = plt.subplots(figsize=(max(6, 0.6 * len(rows) + 2), 4))
    axis.bar([i - 0.2 for i in x], [r["oracle_tps"] for r in rows], 0.4, label="per-window oracle", color="#888")
    axis.bar([i + 0.2 for i in x], [r["deployed_tps"] for r in rows], 0.4, label="deployed (fixed)", color="#1f5fa8")
    axis.set_xticks(list(x), [r["window"] for r in rows], rotation=45, ha="right", fontsize=8)
    deployed = report["deployed"]
    axis.set(
        ylabel="replay tok/s",
        title=f"Deployed {deployed['producer']} budget {deployed['budget']}:\n"
        f"{100 * report['deployed_ratio']:.1f}% of the oracle's pooled TPS",
    )
    axis.legend()
    axis.grid(alpha=0.3, axis="y")
    save(figure, path)
