"""A fake judge for the tests of the search, the run, the suite and the lineage: an executor
(``--executor fake``) whose judging never starts a sandbox, lowers or compiles anything.

Tests that are about the search (which kernel is bred, what is archived, what is resumed, what
MLflow shows) need verdicts, not the judge: the real judge is tested by tests/evaluator/ and by one
real end-to-end test per user path. The fake's verdict is a pure function of the source and the
task, so a run is as deterministic as a real one:

* a source that does not parse: FAIL_SCREEN;
* block sizes whose product passes ``VMEM_BLOCK_ELEMENTS``: FAIL_VMEM (so the repair path runs);
* otherwise PASS, with a figure that is best where every block-like tunable is 512 and moves by a
  few parts in a thousand with the rest of the source (so every operator's edit is seen);
* above the search's cut: PRUNED;
* a source with a line ``# fake judge: fail STATUS,STATUS,...``: one of those statuses, drawn by
  the source's hash, whatever its blocks (a kernel whose every variant fails: the operators keep
  comments, so every kernel bred from it carries the line).

Its provenance is the judge's (the archive's lookup keys, so a resume finds what a run judged)
and every verdict says ``fake judge`` in its log; it writes only to a test's own data directory,
and it lives in tests/, reached as a plugin through the executors' entry-point group
(tests/conftest.py), never installed with the project.
"""

from __future__ import annotations

import hashlib
import math
import re

from evaluator import EvalResult, Metrics, Status
from evolve.executors.base import LocalExecutor
from mutations import discover, parse

REFERENCE_CYCLES = 1_000_000
VMEM_BLOCK_ELEMENTS = 1 << 22
SAID = "fake judge (tests/fake_judge.py): no sandbox, no compiler"
FAIL_MARKER = re.compile(r"^\s*# fake judge: fail (?P<statuses>[A-Z_]+(?:,[A-Z_]+)*)\s*$", re.MULTILINE)
FAILURES = {"FAIL_VMEM": ("compile", "fake judge: blocks over the fake VMEM"),
            "CRASH": ("compile", "fake judge: worker died from signal SIGSEGV (11) during 'compile'"),
            "FAIL_COMPILE": ("compile", "fake judge: the compiler refused it"),
            "FAIL_CORRECTNESS": ("correctness", "fake judge: max abs error 1.0 over the bar")}


def marked_failure(source: str, provenance) -> EvalResult | None:
    """The verdict a ``# fake judge: fail ...`` line asks for (None: no such line)."""
    found = FAIL_MARKER.search(source)
    if found is None:
        return None
    statuses = found.group("statuses").split(",")
    status = statuses[int(hashlib.sha256(source.encode()).hexdigest()[:8], 16) % len(statuses)]
    stage, error = FAILURES.get(status, ("compile", f"fake judge: {status}"))
    return EvalResult(Status(status), error=error, stage=stage, provenance=provenance, log_tail=SAID)


def fake_verdict(source: str, task, provenance, cut: int | None = None, clock_hz: float = 1.5e9) -> EvalResult:
    prov = provenance
    try:
        module = parse(source)
    except Exception as exc:  # noqa: BLE001 - a source the screen would refuse
        return EvalResult(Status.FAIL_SCREEN, error=f"fake judge: does not parse: {exc}", stage="screen",
                          provenance=prov, log_tail=SAID)
    failed = marked_failure(source, prov)
    if failed is not None:
        return failed
    try:
        values = [t.value for t in discover(module, task).values() if isinstance(t.value, int) and t.value > 0]
    except Exception:  # noqa: BLE001 - a kernel discovery cannot read has no tunables here
        values = []
    if math.prod(values) > VMEM_BLOCK_ELEMENTS and len(values) > 1:
        return EvalResult(Status.FAIL_VMEM, error="fake judge: blocks over the fake VMEM", stage="compile",
                          provenance=prov, log_tail=SAID)
    noise = int(hashlib.sha256(source.encode()).hexdigest()[:6], 16) % 1000
    cycles = int(400_000 * (1 + sum(abs(math.log2(v) - 9) for v in values) / 4) * (1 + noise / 100_000))
    if cut is not None and cycles > cut:
        return EvalResult(Status.PRUNED, stage="compile", metrics=Metrics(estimated_cycles=cycles),
                          provenance=prov, log_tail=SAID)
    metrics = Metrics(latency_s=cycles / clock_hz, reference_latency_s=REFERENCE_CYCLES / clock_hz,
                      speedup_vs_reference=REFERENCE_CYCLES / cycles, estimated_cycles=cycles,
                      reference_cycles=REFERENCE_CYCLES, max_abs_error=0.0)
    return EvalResult(Status.PASS, stage="timing", metrics=metrics, provenance=prov, log_tail=SAID)


class FakeExecutor(LocalExecutor):
    """The local executor's threads, judging with ``fake_verdict`` instead of the sandboxed judge."""

    name = "fake"

    def describe(self) -> str:
        return f"by the tests' fake judge, {self.workers} at once"

    def judging(self, judge, task):
        provenance, clock = judge.provenance(task), judge.chip.clock_hz
        return lambda source, cut=None: fake_verdict(source, task, provenance, cut, clock)
