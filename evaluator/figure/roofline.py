"""Roofline figures: what the chip allows for the task, and how close a latency comes to it."""

from __future__ import annotations

import dataclasses

from evaluator.chips import Chip


@dataclasses.dataclass(frozen=True)
class Roofline:
    tflops: float
    mxu_util: float
    hbm_util: float
    regime: str
    roofline_latency_s: float


def roofline(flops: float, bytes_moved: float, latency_s: float, chip: Chip, chips: int = 1) -> Roofline:
    """``flops`` are the useful FLOPs only (causal attention counts its unmasked half). A program on
    ``chips`` chips has that many chips' peak and bandwidth: its utilisations are per chip, and its
    bound is the work spread evenly over them."""
    compute_s = flops / (chip.peak_flops * chips)
    memory_s = bytes_moved / (chip.hbm_bytes_per_s * chips)
    regime = "compute-bound" if compute_s >= memory_s else "memory-bound"
    return Roofline(tflops=flops / latency_s / 1e12, mxu_util=compute_s / latency_s,
                    hbm_util=memory_s / latency_s, regime=regime,
                    roofline_latency_s=max(compute_s, memory_s))
