"""Timing sources: how the judge turns a compiled kernel into a latency.

A family (``seeds/registry.py``): a new source is one ``TimingSource`` class and one registry
line (here, or an entry point ``pallas_evolve.timing`` of an installed package).
"""

from __future__ import annotations

from seeds import Registry
from evaluator.figure.timing._base import Timing, TimingSource

__all__ = ["Timing", "TimingSource", "get_timing_source", "timing_choices", "TIMING_SOURCES"]

TIMING_SOURCES = Registry("timing", {
    "compiler_estimate": "evaluator.figure.timing.compiler_estimate:CompilerEstimate",
    "compiler_estimate_no_vmem_msa": "evaluator.figure.timing.compiler_estimate:CompilerEstimateNoVmemMsa",
    "measured": "evaluator.figure.timing.measured:Measured",
}, member="timing source")


def timing_choices() -> tuple[str, ...]:
    """What ``--timing`` accepts: "auto" (measured on a TPU host, else the compiler estimate) and
    every registered timing source."""
    return ("auto", *TIMING_SOURCES.names())


def get_timing_source(name: str) -> TimingSource:
    """An instance of the timing source called ``name``; ValueError naming the known ones."""
    try:
        return TIMING_SOURCES.load(name)()
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
