"""An individual: a kernel source with its id, its parents, and the edits that made it."""

from __future__ import annotations

from typing import Any

from deap import base

from archive import individual_id


class SpeedupFitness(base.Fitness):
    """Maximise speedup over the task's reference. Failures get no fitness (weight 0 value)."""

    weights = (1.0,)


class Individual:
    """DEAP needs only ``.fitness``; everything else is lineage."""

    def __init__(self, source: str, *, edits: list[dict[str, Any]], parent_ids: tuple[str, ...] = (),
                 operator: str = "seed", params: dict[str, Any] | None = None, generation: int = 0):
        self.source = source
        self.id = individual_id(source)
        self.edits = list(edits)            # full history from the seed: replayable
        self.parent_ids = tuple(parent_ids)
        self.operator = operator            # the edit that made it ("seed", an operator, "crossover")
        self.params = dict(params or {})
        self.generation = generation
        self.fitness = SpeedupFitness()
        self.result = None                  # the judge's EvalResult once evaluated
        self.cut: int | None = None         # the cascade's cut in cycles when it was bred

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def speedup(self) -> float | None:
        return self.result.metrics.speedup_vs_reference if self.passed else None

    @property
    def merit(self) -> float:
        """What the search ranks by (``EvalResult.merit``); 0.0 before judging or on a failure."""
        return self.result.merit if self.passed else 0.0

    def __repr__(self) -> str:
        return f"Individual({self.id}, op={self.operator}, fitness={self.fitness.values})"
