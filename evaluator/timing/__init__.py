"""Timing sources: how the judge turns a compiled kernel into a latency."""

from __future__ import annotations

from evaluator.timing._base import Timing, TimingSource
from evaluator.timing.compiler_estimate import CompilerEstimate
from evaluator.timing.measured import Measured

__all__ = ["Timing", "TimingSource", "CompilerEstimate", "Measured", "get_timing_source",
           "TIMING_SOURCES"]

TIMING_SOURCES: dict[str, type[TimingSource]] = {
    CompilerEstimate.name: CompilerEstimate,
    Measured.name: Measured,
}


def get_timing_source(name: str) -> TimingSource:
    try:
        return TIMING_SOURCES[name]()
    except KeyError:
        raise ValueError(f"unknown timing source {name!r}; choose one of: "
                         f"{', '.join(TIMING_SOURCES)}") from None
