"""DEAP's parts of a run: the toolbox (variation, selection, judging) and the statistics of a
pool, the one source of the per-generation figures."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from deap import base, tools

from evolve.config import RunConfig
from evolve.search.variation import crossover, drop_edit, mutate, tweak_edit


def make_toolbox(config: RunConfig, seed_source: str, task, *, evaluate: Callable,
                 record: Callable, operators: list) -> base.Toolbox:
    """``evaluate(ind) -> outcome`` judges one individual (on an executor's worker);
    ``record(ind, outcome)`` sets its result and fitness and logs it (in the search's thread)."""
    toolbox = base.Toolbox()
    toolbox.register("mutate", mutate, task=task, operators=operators)
    toolbox.register("mate", crossover, seed_source=seed_source, task=task)
    toolbox.register("drop", drop_edit, seed_source=seed_source, task=task)
    toolbox.register("tweak", tweak_edit, seed_source=seed_source, task=task)
    toolbox.register("select", tools.selTournament, tournsize=config.search.tournament_size)
    toolbox.register("evaluate", evaluate)
    toolbox.register("record", record)
    return toolbox


def _passed(values: list[tuple[bool, float | None]]) -> list[float]:
    return [speedup for passed, speedup in values if passed and speedup is not None]


def _median(values: list[tuple[bool, float | None]]) -> float | None:
    speedups = _passed(values)
    return statistics.median(speedups) if speedups else None


def make_statistics() -> tools.Statistics:
    """DEAP's statistics over a pool, the one source of the per-generation figures (the logbook,
    MLflow's metrics, the archive's generation records): the best and the median speedup of the
    kernels that passed (None when none did) and the fraction that passed."""
    stats = tools.Statistics(key=lambda ind: (ind.passed, ind.speedup))
    stats.register("best", lambda values: max(_passed(values), default=None))
    stats.register("median", _median)
    stats.register("pass_rate", lambda values: sum(passed for passed, _ in values) / len(values) if values else 0.0)
    return stats
