"""A surrogate that ranks bred children before any is judged.

A ridge regression of log(estimated cycles) on what a kernel is made of: the log2 of its integer
tunables (block sizes, heads per program, strip height, VMEM limit), the block shape's aspect
(|log2 a - log2 b| for each pair of block sizes) and which operators its edit history applied.
It learns from every kernel the run has an estimate for (PASS, and PRUNED: the cascade keeps
their estimates), so it is only as good as the run's own data, and it is
never a verdict: a child it ranks first is still judged in full, and a child it ranks last is
simply not bred this generation. Deterministic: numpy least squares, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mutations import read_tunables

RIDGE = 1e-2


def features(source: str, edits: list[dict[str, Any]], operators: list[str],
             tunables: list[str], pairs: list[tuple[str, str]] = (),
             read: Callable[[str], dict[str, int]] = read_tunables) -> np.ndarray:
    values = read(source)
    logs = {t: math.log2(values[t]) if values.get(t, 0) > 0 else 0.0 for t in tunables}
    used = {e.get("op") for e in edits}
    row = [1.0]
    row += [logs[t] for t in tunables]
    # A block shape's aspect: how far apart two sizes are, which no weighted sum of their logs
    # can say (a square block may pay where either side alone does not).
    row += [abs(logs.get(a, 0.0) - logs.get(b, 0.0)) for a, b in pairs]
    row += [1.0 if op in used else 0.0 for op in operators]
    return np.asarray(row)


class Surrogate:
    """Fit on (source, edits, cycles); predict log-cycles for new (source, edits)."""

    def __init__(self, operators: list[str], tunables: list[str], min_points: int = 6,
                 pairs: list[tuple[str, str]] = (),
                 read: Callable[[str], dict[str, int]] = read_tunables) -> None:
        self.operators, self.tunables, self.min_points = list(operators), list(tunables), min_points
        self.pairs, self.read = list(pairs), read
        self.rows: list[np.ndarray] = []
        self.targets: list[float] = []
        self.seen: set[str] = set()
        self.coef: np.ndarray | None = None

    def add(self, key: str, source: str, edits: list[dict[str, Any]], cycles: int | None) -> None:
        if key in self.seen or not cycles:
            return
        self.seen.add(key)
        self.rows.append(features(source, edits, self.operators, self.tunables, self.pairs, self.read))
        self.targets.append(math.log(cycles))
        self.coef = None

    @property
    def ready(self) -> bool:
        return len(self.rows) >= self.min_points

    def predict(self, source: str, edits: list[dict[str, Any]]) -> float:
        """Predicted log(cycles); lower is faster."""
        if self.coef is None:
            x, y = np.vstack(self.rows), np.asarray(self.targets)
            reg = RIDGE * np.eye(x.shape[1])
            reg[0, 0] = 0.0                      # the intercept is not shrunk
            self.coef = np.linalg.solve(x.T @ x + reg, x.T @ y)
        return float(features(source, edits, self.operators, self.tunables, self.pairs, self.read) @ self.coef)
