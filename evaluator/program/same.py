"""Kernels that are one program: two sources whose lowered programs are identical get one verdict.

A search makes many such pairs: an edit the program does not see (a comment, a renamed local, a
block size that a wrapper's own loop recomputes, a tunable no ``BlockSpec`` reads). The trusted
runner hashes what it lowered itself from the candidate's jaxpr (the StableHLO module with each
Mosaic kernel serialized in it, for the judged chip: SHA-256 of its bytecode) and reports it with
the audit; before compiling, it stops where that hash is one this judge has already given a
verdict for on the same task and chip count, and the judge gives the earlier verdict again,
saying so. The hash is the runner's, never the worker's: a worker that lied about its program
could otherwise borrow another kernel's verdict.

Only verdicts the program alone decides are reused: not PRUNED (it depends on the search's cut
at the time), not TIMEOUT, CRASH or OOM (they depend on the machine). A reused PASS is held to
the cut of the judgement that reuses it: over the cut, it ends PRUNED, as a fresh judgement of
the same program would (its estimate kept; no speed, no sign of correctness). Memory only: a
judge's lifetime, one run.
"""

from __future__ import annotations

import dataclasses
import threading

from evaluator.result import EvalResult, Status

REUSED = frozenset({Status.PASS, Status.FAIL_LOWER, Status.FAIL_COMPILE, Status.FAIL_VMEM, Status.FAIL_CORRECTNESS,
                    Status.SUSPECT, Status.FAIL_TIMING, Status.FAIL_TRACE})


class SamePrograms:
    """The verdicts of the programs this judge has judged, by (task, chips, program hash)."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple, EvalResult] = {}
        self._lock = threading.Lock()
        self.reused = 0

    def known(self, task, chips: int) -> list[str]:
        """The hashes with a verdict on ``task`` at ``chips``: the runner stops at one of them."""
        with self._lock:
            return sorted(d for t, c, d in self._verdicts if t == task and c == chips)

    def remember(self, task, result: EvalResult) -> None:
        digest = result.metrics.program_sha256
        if digest and result.status in REUSED:
            with self._lock:
                self._verdicts.setdefault((task, result.metrics.chips or 1, digest), result)

    def again(self, task, chips: int, digest: str, wall_time_s: float,
              prune_above_cycles: int | None = None) -> EvalResult | None:
        """The earlier verdict on the program ``digest``, said to be reused (None: none known),
        held to ``prune_above_cycles`` as a fresh judgement would be."""
        with self._lock:
            earlier = self._verdicts.get((task, chips, digest))
            if earlier is not None:
                self.reused += 1
        if earlier is None:
            return None
        note = (f"judged once: this kernel lowers to the same program as one judged before "
                f"(program sha256 {digest[:16]}); its verdict is that kernel's")
        metrics = dataclasses.replace(earlier.metrics, runner_time_s=wall_time_s, compile_time_s=None,
                                      correctness_time_s=None, timing_time_s=None)
        cycles = metrics.estimated_cycles
        if earlier.status is Status.PASS and prune_above_cycles is not None and cycles is not None \
                and cycles > prune_above_cycles:
            return pruned(cycles, prune_above_cycles, metrics, earlier.provenance, log_tail=note)
        return dataclasses.replace(earlier, log_tail=note, metrics=metrics)


def pruned(cycles: int, cut: int, metrics, provenance, log_tail: str = "") -> EvalResult:
    """The verdict on a kernel whose estimate is over the cut: the estimate and what the compile
    told, and nothing that correctness or timing would have (no speed, so no fitness)."""
    kept = dataclasses.replace(
        metrics, estimated_cycles=cycles, latency_s=None, latency_ci_s=None, reference_latency_s=None,
        speedup_vs_reference=None, tflops=None, mxu_util=None, hbm_util=None, regime=None,
        roofline_latency_s=None, max_abs_error=None, max_rel_error=None, reference_max_abs_error=None,
        correctness_time_s=None, timing_time_s=None)
    return EvalResult(Status.PRUNED, stage="prune", provenance=provenance, log_tail=log_tail, metrics=kept, error=(
        f"estimated {cycles:,} cycles, over the cut of {cut:,}: too slow to matter, so it was not "
        "checked for correctness and has no speed"))
