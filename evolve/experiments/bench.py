"""`evolve bench`: search strategies measured side by side on one task, one judge, one archive.

Each strategy (evolve/search/strategies.py) runs as an ordinary evolution run with the same budget of
distinct kernels, the same executor and the same data directory, once per repeat (repeat r uses
RNG seed base + r). A kernel judged once serves every strategy: the archive answers, so repeats
and overlapping strategies cost only the kernels nobody judged yet.

Reported per strategy, from the order each run took its kernels in:
* the best-so-far curve (speedup over the XLA reference) against evaluations, as a table and a PNG;
* evaluations to reach 95% of the best kernel any strategy found (the optimum here);
* Kernel Tuner's score, (random - best) / (random - optimum) in estimated cycles (or latency),
  with each strategy's best after the full budget averaged over the repeats: 0 is random
  search, 1 is the optimum, below 0 is worse than random.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from evolve.config import RunConfig

TARGET = 0.95


@dataclasses.dataclass(frozen=True)
class Trial:
    strategy: str
    repeat: int
    run_id: str
    curve: tuple[float, ...]          # best PASS speedup after each evaluation (0.0: none yet)
    best_cost: float | None           # the champion's cycles (or latency) after the budget
    judged: int                       # kernels this trial judged itself (the rest: the archive)
    minutes: float


def result_cost(result) -> float | None:
    """A verdict's cost: its estimated cycles, else its measured latency (None: neither)."""
    m = result.metrics
    return float(m.estimated_cycles) if m.estimated_cycles else m.latency_s


def reference_cost(result) -> float | None:
    """The task's XLA program's cost in the same verdict, in the same unit as :func:`result_cost`."""
    m = result.metrics
    if m.estimated_cycles:
        return float(m.reference_cycles) if m.reference_cycles else None
    return m.reference_latency_s


def _cost(ind) -> float | None:
    return result_cost(ind.result)


def run_trial(config: RunConfig, data_dir: str, run_id: str, strategy: str, repeat: int,
              executor=None) -> tuple[Trial, Any]:
    from evolve.run import EvolutionRun

    run = EvolutionRun(config, data_dir, run_id=run_id, strategy=strategy, executor=executor)
    start = time.monotonic()
    champion = run.start()
    best, curve = 0.0, []
    for ind in run.search.taken:
        if ind.passed:
            best = max(best, ind.speedup or 0.0)
        curve.append(best)
    trial = Trial(strategy, repeat, run_id, tuple(curve), _cost(champion) if champion else None,
                  run.progress.judged, (time.monotonic() - start) / 60)
    return trial, run


def evaluations_to(curve: tuple[float, ...], level: float) -> int | None:
    """1-based count of evaluations after which the curve first reaches ``level``."""
    for i, value in enumerate(curve):
        if value >= level > 0:
            return i + 1
    return None


def spread(values: list[float]) -> tuple[float, float, float] | None:
    """(median, first quartile, third quartile) of ``values``; None when empty."""
    if not values:
        return None
    if len(values) == 1:
        return (values[0],) * 3
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q1, q3


def summarise(trials: list[Trial], budget: int | None = None) -> dict[str, Any]:
    """Per strategy, over its repeats: the median and interquartile range of the final best
    speedup, of the final best cost, and of the evaluations to the target (a repeat that never
    reached it counts as budget + 1: the median says "not reached" when half did not)."""
    optimum = max((max(t.curve, default=0.0) for t in trials), default=0.0)
    level = TARGET * optimum
    costs = [t.best_cost for t in trials if t.best_cost]
    best_cost = min(costs) if costs else None
    budget = budget or max((len(t.curve) for t in trials), default=0)
    rows = {}
    for name in dict.fromkeys(t.strategy for t in trials):
        mine = [t for t in trials if t.strategy == name]
        needed = [evaluations_to(t.curve, level) for t in mine]
        reached = [n for n in needed if n is not None]
        mine_costs = [t.best_cost for t in mine if t.best_cost]
        rows[name] = {
            "repeats": len(mine),
            "best_speedup": max(max(t.curve, default=0.0) for t in mine),
            "mean_final_speedup": statistics.fmean(t.curve[-1] if t.curve else 0.0 for t in mine),
            "final_speedup_spread": spread([t.curve[-1] if t.curve else 0.0 for t in mine]),
            "mean_best_cost": statistics.fmean(mine_costs) if len(mine_costs) == len(mine) else None,
            "best_cost_spread": spread(mine_costs) if len(mine_costs) == len(mine) else None,
            "evaluations_to_target": needed,
            "evaluations_spread": spread([float(n if n is not None else budget + 1) for n in needed]),
            "median_evaluations_to_target": statistics.median(reached) if len(reached) == len(mine) else None,
            "reached_target": f"{len(reached)}/{len(mine)}",
            "judged": sum(t.judged for t in mine),
            "minutes": sum(t.minutes for t in mine),
        }
    random_cost = rows.get("random", {}).get("mean_best_cost")
    for row in rows.values():
        score = None
        if random_cost and row["mean_best_cost"] and best_cost and random_cost != best_cost:
            score = (random_cost - row["mean_best_cost"]) / (random_cost - best_cost)
        row["kernel_tuner_score"] = score
    unit = "cycles" if best_cost and best_cost > 1 else "s"
    return {"optimum_speedup": optimum, "target_speedup": level, "optimum_cost": best_cost, "cost_unit": unit,
            "budget": budget, "strategies": rows}


def _spread_text(value: tuple[float, float, float] | None, fmt: str, budget: int | None = None) -> str:
    if value is None:
        return "-"

    def one(v: float) -> str:
        return f">{budget}" if budget is not None and v > budget else format(v, fmt)

    median, q1, q3 = value
    return f"{one(median)} [{one(q1)}, {one(q3)}]"


def format_table(summary: dict[str, Any], budget: int) -> str:
    lines = [f"optimum (best any strategy found): {summary['optimum_speedup']:.3f}x the XLA reference"
             + (f", {summary['optimum_cost']:,.0f} {summary['cost_unit']}" if summary["optimum_cost"] else ""),
             f"target: {TARGET:.0%} of it = {summary['target_speedup']:.3f}x; budget {budget} distinct kernels; "
             "figures over repeats are median [first quartile, third quartile]",
             f"| strategy | repeats | best | final speedup | final {summary['cost_unit']} | "
             "evaluations to target | each repeat | reached | Kernel Tuner score | judged | minutes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary["strategies"].items():
        each = ", ".join(str(n) if n is not None else f">{budget}" for n in r["evaluations_to_target"])
        score = f"{r['kernel_tuner_score']:.2f}" if r["kernel_tuner_score"] is not None else "-"
        lines.append(f"| {name} | {r['repeats']} | {r['best_speedup']:.3f}x | "
                     f"{_spread_text(r['final_speedup_spread'], '.3f')} | "
                     f"{_spread_text(r['best_cost_spread'], ',.0f')} | "
                     f"{_spread_text(r['evaluations_spread'], 'g', budget)} | {each} | {r['reached_target']} | "
                     f"{score} | {r['judged']} | {r['minutes']:.1f} |")
    return "\n".join(lines)


def curve_table(trials: list[Trial]) -> str:
    """Best-so-far speedup after each evaluation, one column per trial."""
    names = [f"{t.strategy} r{t.repeat}" for t in trials]
    lines = ["| evaluations | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i in range(max((len(t.curve) for t in trials), default=0)):
        cells = [f"{t.curve[i]:.3f}" if i < len(t.curve) else "" for t in trials]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(trials: list[Trial], summary: dict[str, Any], path: Path, title: str,
         peers: dict[str, dict] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for k, name in enumerate(dict.fromkeys(t.strategy for t in trials)):
        colour = f"C{k}"
        mine = [t for t in trials if t.strategy == name]
        for t in mine:       # each repeat, faint
            ax.step(range(1, len(t.curve) + 1), t.curve, where="post", color=colour, alpha=0.25, linewidth=0.8)
        length = max(len(t.curve) for t in mine)
        bands = [spread([t.curve[min(i, len(t.curve) - 1)] for t in mine if t.curve]) for i in range(length)]
        x = range(1, length + 1)
        ax.step(x, [b[0] for b in bands], where="post", color=colour, linewidth=2,
                label=f"{name}: median of {len(mine)}")
        if len(mine) > 1:
            ax.fill_between(x, [b[1] for b in bands], [b[2] for b in bands], step="post", color=colour,
                            alpha=0.2, label=f"{name}: interquartile range")
    ax.axhline(summary["target_speedup"], color="grey", linestyle="--", linewidth=1,
               label=f"{TARGET:.0%} of the best found")
    for name, peer in (peers or {}).items():
        if peer.get("speedup_vs_reference"):
            ax.axhline(peer["speedup_vs_reference"], color="black", linestyle=":", linewidth=1, label=name)
    ax.set_xlabel("distinct kernels evaluated")
    ax.set_ylabel("best speedup so far (x XLA reference)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, trials: list[Trial], summary: dict[str, Any], meta: dict[str, Any]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "table": out / "bench.md", "plot": out / "bench.png"}
    paths["json"].write_text(json.dumps({**meta, "summary": summary,
                                         "trials": [dataclasses.asdict(t) for t in trials]}, indent=1))
    paths["table"].write_text(format_table(summary, meta["budget"]) + "\n\n" + curve_table(trials) + "\n")
    plot(trials, summary, paths["plot"], f"{meta['task_key']} · {meta['timing_source']} · "
                                         f"libtpu {meta['libtpu_version']}", meta.get("peers"))
    return paths
