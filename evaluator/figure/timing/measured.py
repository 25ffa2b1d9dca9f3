"""Wall-clock timing on a real TPU: warm-up, many runs, median and a bootstrap 95% CI."""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

from evaluator.chips import Chip
from evaluator.figure.timing._base import Timing, TimingSource


def bootstrap_ci(samples: list[float], *, resamples: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the median."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(samples, k=len(samples)))
                     for _ in range(resamples))
    lo = medians[int((1 - level) / 2 * resamples)]
    hi = medians[min(int((1 + level) / 2 * resamples), resamples - 1)]
    return (lo, hi)


class Measured(TimingSource):
    name = "measured"
    description = "median of timed runs on the TPU with block_until_ready, after warm-up"
    needs_tpu = True

    def __init__(self, warmup: int = 5, iters: int = 50) -> None:
        if warmup < 0 or iters < 3:
            raise ValueError("measured timing needs warmup >= 0 and iters >= 3")
        self.warmup, self.iters = warmup, iters

    def worker_request(self) -> dict[str, Any] | None:
        return {"warmup": self.warmup, "iters": self.iters}

    def read(self, scratch: Path, stage_data: dict[str, dict], chip: Chip) -> Timing:
        samples = (stage_data.get("timing") or {}).get("samples_s") or []
        if len(samples) < 3:
            return Timing(None, error="the worker returned no timing samples")
        return Timing(statistics.median(samples), ci_s=bootstrap_ci(list(samples)))
