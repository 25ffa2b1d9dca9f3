"""From what a child did to a status: failure classification, and the output's comparison.

A child that did not finish cleanly (a stage over its budget, an error it reported, a signal, an
exit without a result) becomes exactly one ``Status`` with a one-line reason; an output becomes
PASS or FAIL_CORRECTNESS by ``compare.py``, on every chip of a per-chip program.
"""

from __future__ import annotations

import dataclasses
import re
import signal

import numpy as np

from evaluator.correctness.compare import Comparison, compare
from evaluator.correctness.ground_truth import GroundTruth
from evaluator.result import Status
from evaluator.containment.sandbox import WALL_BACKSTOP, ChildOutcome
from seeds import SeedTask

# libtpu 0.0.42.1: "Static LLO profiling of <op> failed: INVALID_ARGUMENT: Unsupported DMA direction ..."
_PROFILER_FAILURE = re.compile(r"(Static LLO profiling of \S+ failed:[^\n]*)")


def first_lines(text: str, limit: int = 600) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    out = " | ".join(lines[:3])
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify_error(stage: str, kind: str, message: str) -> Status:
    """The status of an error a child reported in ``stage`` (its exception's type and message)."""
    low = message.lower()
    if "vmem" in low and any(k in low for k in ("resource_exhausted", "out of memory", "oom")):
        return Status.FAIL_VMEM
    if kind == "MemoryError" or any(k in low for k in ("bad_alloc", "cannot allocate memory",
                                                       "out of memory allocating")):
        return Status.OOM           # the host's memory (XLA:CPU's "RESOURCE_EXHAUSTED: Out of memory
                                    # allocating N bytes" under the child's address space): no verdict on the kernel
    if kind in ("KnobRefused", "Uncountable"):   # a compiler parameter the judge does not model
        return Status.FAIL_TIMING                  # (compiler_params.py), work it cannot count (variants.py)
    if kind in ("Refused", "WireError"):
        return Status.FAIL_TRACE
    return {"load": Status.FAIL_LOWER, "lower": Status.FAIL_LOWER, "compile": Status.FAIL_COMPILE,
            "correctness": Status.FAIL_CORRECTNESS, "trips": Status.FAIL_TIMING,
            "timing": Status.CRASH}.get(stage, Status.CRASH)


# A child's files are bounded (RLIMIT_FSIZE) by the judge's Limits.file_bytes, raised for each task
# to its largest array (children.py): past it, a child wrote more than the task holds.
_FILE_LIMIT = ("; a child's files are limited to the judge's Limits.file_bytes (RLIMIT_FSIZE), raised to the "
               "task's largest array: a kernel or workload that writes more is refused")


def failure(outcome: ChildOutcome, budgets: dict[str, float], default_budget: float
            ) -> tuple[Status, str, str] | None:
    """(status, stage, reason) of a child that did not finish cleanly, or None if it did."""
    if outcome.timed_out_stage:
        stage = outcome.timed_out_stage
        budget = budgets.get(stage, default_budget)
        if outcome.timed_out_by_wall:
            return Status.TIMEOUT, stage, (
                f"stage '{stage}' ran {WALL_BACKSTOP:g}x its budget of {budget:g} CPU seconds in wall-clock time "
                f"while using {outcome.timed_out_cpu_s or 0:g} CPU seconds (it waited, or slept) and the "
                "worker's process group was killed")
        return Status.TIMEOUT, stage, (f"stage '{stage}' used {outcome.timed_out_cpu_s or budget:g} CPU seconds, "
                                       f"past its budget of {budget:g}, and the worker's process group was killed")
    errors = [e for e in outcome.events if e.get("event") == "error"]
    if errors:
        e = errors[0]
        stage, kind, message = str(e.get("stage")), str(e.get("kind")), str(e.get("message"))
        hint = _FILE_LIMIT if "requested and" in message and "written" in message else ""
        return classify_error(stage, kind, message), stage, first_lines(message) + hint
    stages = [e.get("stage") for e in outcome.events if e.get("event") == "stage"]
    stage = str(stages[-1]) if stages else "start"
    profiler = _PROFILER_FAILURE.search(outcome.output)
    if outcome.signal is not None and profiler:
        # libtpu's static profiler aborts the whole compile on some DMA patterns: the kernel
        # may be fine, but the estimate has no figure for it (never counted as free).
        hint = ("; or judge the whole task with --timing compiler_estimate_no_vmem_msa, which keeps such "
                "arrays out of VMEM" if "DMA direction" in profiler.group(1) else "")
        return Status.FAIL_TIMING, stage, (f"the compiler's static profiler cannot estimate this kernel "
                                           f"({profiler.group(1).strip()[:200]}); time it on a TPU host{hint}")
    if outcome.signal is not None:
        name = _signal_name(outcome.signal)
        if outcome.signal == signal.SIGXFSZ:
            return Status.CRASH, stage, f"worker wrote a file past its size limit during '{stage}'" + _FILE_LIMIT
        if outcome.signal == signal.SIGKILL:
            return Status.OOM, stage, f"worker killed by {name} during '{stage}' (the OOM killer?)"
        low = outcome.output.lower()
        if "bad_alloc" in low or "out of memory" in low:
            return Status.OOM, stage, f"worker ran out of memory during '{stage}' ({name})"
        return Status.CRASH, stage, f"worker died from signal {name} ({outcome.signal}) during '{stage}'"
    if not any(e.get("event") == "done" for e in outcome.events):
        tail = first_lines(outcome.output[-1500:])
        return Status.CRASH, stage, (f"worker exited with status {outcome.returncode} during "
                                     f"'{stage}' without a result" + (f": {tail}" if tail else ""))
    return None


def tolerance(task: SeedTask, truth: GroundTruth, factor: float) -> tuple[float, float]:
    """(atol, rtol): the task's, unless the task's own XLA program, computed as the chip computes
    it (f32 dots in bf16 passes, ``precision.py``; a deep chain of bf16 products, MLA's seven
    weights, whose ``scaled`` draw moves its output by the factor to the fourth power) misses that
    tolerance on this set itself: then the plain work on the chip is less precise than the task's
    dtype says, and a kernel of it is held to ``factor`` times the XLA program's own worst error,
    measured against the same bound (the precision rule still holds its 99th-percentile and mean
    errors to the XLA program's). A task whose program states ``HIGHEST`` keeps its tolerance, and
    a one-pass kernel of it fails, naming its dots."""
    atol, rtol = task.tolerance
    if truth.program_out is None:
        return atol, rtol
    ref = np.asarray(truth.f32, np.float32)
    program = np.asarray(truth.program_out, np.float32)
    finite = np.isfinite(ref) & np.isfinite(program)
    scale = 1.0
    if truth.magnitude is not None:
        magnitude = np.asarray(truth.magnitude, np.float32)
        scale = np.where(np.isfinite(magnitude), np.maximum(1.0, magnitude), 1.0)
    bound = atol * scale + rtol * np.abs(ref)
    ratio = np.where(finite, np.abs(program - ref) / np.maximum(bound, 1e-30), 0.0)
    worst = float(ratio.max()) if ratio.size else 0.0
    if worst <= 1.0:
        return atol, rtol
    return atol * worst * factor, rtol * worst * factor


def compare_chips(out: np.ndarray, truth: GroundTruth, task: SeedTask, chips: int, factor: float) -> Comparison:
    """The output against the truth; a per-chip program's output is every chip's, and every chip
    must hold the right answer (the first that does not is the verdict)."""
    atol, rtol = tolerance(task, truth, factor)
    kwargs = dict(expected_dtype=task.output_dtype, atol=atol, rtol=rtol, baseline=truth.program_out,
                  baseline_factor=factor, magnitude=truth.magnitude)
    if chips == 1:
        return compare(out, truth.f32, label=truth.label, **kwargs)
    if out.shape != (chips, *truth.f32.shape):
        return Comparison(False, error=f"{truth.label}: the per-chip program's outputs have shape "
                          f"{out.shape}, not one whole output {truth.f32.shape} on each of {chips} chips")
    every = []
    for chip in range(chips):
        cmp = compare(out[chip], truth.f32, label=f"{truth.label}, chip {chip} of {chips}", **kwargs)
        if not cmp.ok:
            return cmp
        every.append(cmp)
    fields = ("max_abs_error", "max_rel_error", "baseline_abs_error")
    return dataclasses.replace(every[0], **{f: max(getattr(c, f) or 0.0 for c in every) for f in fields})
