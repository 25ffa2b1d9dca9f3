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
at the time), not TIMEOUT, CRASH or OOM (they depend on the machine). Memory only: a judge's
lifetime, one run.
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

    def again(self, task, chips: int, digest: str, wall_time_s: float) -> EvalResult | None:
        """The earlier verdict on the program ``digest``, said to be reused (None: none known)."""
        with self._lock:
            earlier = self._verdicts.get((task, chips, digest))
            if earlier is not None:
                self.reused += 1
        if earlier is None:
            return None
        note = (f"judged once: this kernel lowers to the same program as one judged before "
                f"(program sha256 {digest[:16]}); its verdict is that kernel's")
        return dataclasses.replace(earlier, log_tail=note, metrics=dataclasses.replace(
            earlier.metrics, runner_time_s=wall_time_s, compile_time_s=None, correctness_time_s=None))
