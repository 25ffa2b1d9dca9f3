"""The judge: screen -> trace -> audit -> compile -> correctness -> performance -> metrics.

Every candidate ends with exactly one ``Status`` in a frozen ``EvalResult``; nothing raises.
This module is the pipeline; each concern it calls on has a module of its own:

* ``children.py``: the two children per candidate, one after the other: the jailed **worker**
  (the only process that runs candidate code; it traces once and ships the jaxpr as data) and the
  trusted **runner** (lowers both ways, audits, compiles, runs the interpreter on the inputs);
* ``reference.py``: the task's reference figure (cached) and the ground truth, made before any
  candidate runs; ``ground_truth.py``: the secret input sets;
* ``verdicts.py``: a child's failure as a status, and the output's comparison;
* ``timing/``: the timing sources, which say what they can count, cache and prune.

The reference, the inputs, the comparison and the verdict stay in this process. A judge runs
one candidate per call; parallelism is the executor's (``evolve/executors/base.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence

from seeds import load_array
from evaluator.chips import Chip, get_chip
from evaluator.containment.children import Children, on_tpu_host, private_dir, stage_data, write_inputs
from evaluator.program.constants import BUDGET_BYTES
from evaluator.correctness.ground_truth import GroundTruth, set_counts
from evaluator.program.kernel_audit import COUNTED_ON_DATA
from evaluator.program.same import SamePrograms, pruned
from evaluator.correctness.reference import References
from evaluator.result import EvalResult, Metrics, Provenance, Status
from evaluator.figure.roofline import roofline
from evaluator.containment.sandbox import ChildOutcome, Limits
from evaluator.containment.screen import screen_source
from evaluator.figure.timing import Timing, TimingSource, get_timing_source, timing_choices
from evaluator.correctness.verdicts import compare_chips, failure
from evaluator.versions import versions
from evaluator.containment.worker import PROGRAM_FILE
from seeds import SeedTask

_WARNED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class StageBudgets:
    """CPU seconds per stage (the child and every process under it), enforced from outside the child;
    a wall-clock backstop of sandbox.WALL_BACKSTOP times as long ends one that sleeps."""

    # CPU seconds count every thread: a compile or an interpreted check spreads over the cores, so the
    # stages that do are given twice the seconds they had when budgets read the clock.
    load_s: float = 60.0
    lower_s: float = 120.0
    compile_s: float = 600.0
    correctness_s: float = 1200.0
    trips_s: float = 600.0            # compiling the variants of a kernel whose work depends on data
    timing_s: float = 300.0

    def as_dict(self) -> dict[str, float]:
        return {"load": self.load_s, "lower": self.lower_s, "compile": self.compile_s,
                "correctness": self.correctness_s, "trips": self.trips_s, "timing": self.timing_s}


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    chip: str = "v5e"
    timing: str = "auto"                 # "auto": measured on a TPU host, else compiler_estimate
    budgets: StageBudgets = StageBudgets()
    limits: Limits = Limits()
    # (distribution, PRNG seed) per input set, public; None: the task's distributions, each with a
    # secret seed drawn by the judge from the OS (ground_truth.py), the default.
    correctness_inputs: tuple[tuple[str, int], ...] | None = None
    workers: int = max(1, os.cpu_count() or 1)   # judges at once, for an executor built from this config
    cache_dir: str | None = None         # reference timings; default ~/.cache/pallas-evolve
    entry: str | None = None             # the kernel's entry point; None: the task's
    suspect_factor: float = 1.0          # faster than roofline * factor -> SUSPECT
    # A candidate's error may be at most this multiple of the task's own XLA program's error.
    reference_error_factor: float = 1.5
    # Bytes of constants a candidate's program may carry (evaluator/program/constants.py).
    constant_budget_bytes: int = BUDGET_BYTES

    def __post_init__(self) -> None:
        get_chip(self.chip)
        if self.timing not in timing_choices():
            raise ValueError(f"unknown timing source {self.timing!r}; use {', '.join(timing_choices())}")
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if self.correctness_inputs is not None and not self.correctness_inputs:
            raise ValueError("correctness needs at least one input set")


class Judge:
    """Evaluates kernel sources for one chip and timing source. Thread-safe; reuse it."""

    def __init__(self, config: JudgeConfig = JudgeConfig()) -> None:
        self.config = config
        self.chip: Chip = get_chip(config.chip)
        self.on_tpu = on_tpu_host()
        name = config.timing if config.timing != "auto" else (
            "measured" if self.on_tpu else "compiler_estimate")
        self.timing: TimingSource = get_timing_source(name)
        if self.timing.needs_tpu and not self.on_tpu:
            raise ValueError(f"{name} timing needs a TPU host; use --timing compiler_estimate")
        self.children = Children(config, self.chip, self.timing, self.on_tpu)
        self.isolation = self.children.isolation
        if not self.isolation.enabled and "jail" not in _WARNED:
            _WARNED.add("jail")
            print(f"WARNING: candidate code will run WITHOUT operating-system isolation "
                  f"({self.isolation.reason}); only process limits and the source screen stand "
                  "between a candidate and this machine.", file=sys.stderr)
        self.references = References(self.children, self.source_label, config.cache_dir)
        self.same = SamePrograms()       # verdicts by lowered program: one program, one judgement

    # ---- provenance --------------------------------------------------------------------------
    def source_label(self, task: SeedTask | None = None) -> str:
        """What this judge's figures on ``task`` are called (the timing source's label for it)."""
        return self.timing.label_for(task)

    def provenance(self, task: SeedTask | None = None) -> Provenance:
        v = versions()
        sets, secret = set_counts(task, self.config.correctness_inputs) if task is not None else (None, None)
        return Provenance(timing_source=self.source_label(task), chip=self.chip.name,
                          jax_version=v["jax_version"], jaxlib_version=v["jaxlib_version"],
                          libtpu_version=v["libtpu_version"], correctness_sets=sets, secret_sets=secret)

    # ---- the reference -------------------------------------------------------------------------------
    def reference_timing(self, task: SeedTask) -> Timing:
        """The task's plain XLA program, compiled for the same chip, timed by the same source."""
        return self.references.figure(task)

    def ground_truth(self, task: SeedTask) -> tuple[Timing, list[GroundTruth]]:
        """The task's reference figure and ground truth, made here once (for a judge elsewhere)."""
        truth = self.references.truth(task)
        return self.references.figure(task), truth

    def adopt(self, task: SeedTask, reference: Timing, truth: Sequence[GroundTruth]) -> None:
        """Take another judge's reference figure and ground truth for ``task``."""
        self.references.adopt(task, reference, truth)

    def _failure(self, outcome: ChildOutcome) -> tuple[Status, str, str] | None:
        return failure(outcome, self.config.budgets.as_dict(), self.config.budgets.load_s)

    # ---- the pipeline ---------------------------------------------------------------------------
    def evaluate(self, source: str, task: SeedTask, *, prune_above_cycles: int | None = None
                 ) -> EvalResult:
        """Judge one kernel source. Never raises.

        ``prune_above_cycles`` turns on the cascade (a source that can prune: the compiler
        estimate): a kernel whose figure is over it ends ``PRUNED`` after the compile, without the
        correctness stage, with its estimate recorded but no latency, no speedup and so no fitness."""
        start = time.monotonic()
        try:
            result = self._evaluate(source, task, prune_above_cycles)
            self.same.remember(task, result)
        except Exception as exc:  # noqa: BLE001 - a judge bug must not kill a run
            result = EvalResult(Status.CRASH, error=f"internal judge error: {type(exc).__name__}: {exc}",
                                stage="judge", provenance=self.provenance(task))
        return dataclasses.replace(result, wall_time_s=time.monotonic() - start)

    def estimate(self, source: str, task: SeedTask) -> tuple[int | None, list[dict], str]:
        """The compiler's estimate of a source, with the audit's findings, and no correctness
        check: (cycles or None, findings, why there is no figure). For sweeps and measurements
        of trusted kernels; a candidate's figure only ever comes from ``evaluate``."""
        timing, findings = self.estimate_timing(source, task)
        return timing.cycles, findings, timing.error

    def estimate_timing(self, source: str | None, task: SeedTask, *, count: bool = False
                        ) -> tuple[Timing, list[dict]]:
        """:meth:`estimate` as a Timing (with its compute and HBM parts); ``source`` None: the
        task's own XLA program (trusted), without running it on the CPU. With ``count``, a
        candidate's loops, branches and DMAs on data are counted on the timing input (input set
        1, run in the interpreter but not checked: ``evaluate`` checks) and the findings they
        account for are left out of those returned; without it they stay in (the estimate
        cannot see them)."""
        program = None
        if source is not None:
            outcome, program = self.children.trace(*self._called(source, task), task=task)
            failed = self._failure(outcome)
            if failed is not None or program is None:
                return Timing(None, error=failed[2] if failed else "the worker exported nothing"), []
        private = private_dir("estimate")
        try:
            path = private / PROGRAM_FILE
            if program is not None:
                path.write_bytes(program)
            small = self.references.write_timing_input(task, private / "timing_input")
            chips = self._traced_chips(outcome, task) if program is not None else 1
            if chips is None:
                return Timing(None, error=f"the worker claims a chip count the task ({task.chips}) does not offer"), []
            inputs = []
            if count and program is not None:
                inputs = write_inputs(private, task.input_names, [self.references.timing_inputs(task)])
            run = self.children.runner(private, task, "candidate" if program is not None else "reference",
                                       str(path) if program is not None else None, inputs, timing_input=small,
                                       chips=chips)
            failed = self._failure(run)
            if failed is not None:
                return Timing(None, error=failed[2]), []
            data = stage_data(run)
            findings = data.get("audit", {}).get("findings", [])
            if "cycles" in data.get("trips", {}):
                findings = [f for f in findings if f.get("construct") not in COUNTED_ON_DATA]
            return self.timing.read(private, data, self.chip), findings
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def _called(self, source: str, task: SeedTask) -> tuple[str, str]:
        """The source the worker loads and the function it calls: ``--entry``, else the task's
        (which may append a call of its own: ``SeedTask.kernel_call``)."""
        called, entry = task.kernel_call(source)
        return (source, self.config.entry) if self.config.entry and called == source else (called, entry)

    def _traced_chips(self, outcome: ChildOutcome, task: SeedTask) -> int | None:
        """The chip count the worker traced the candidate for: 1, or the task's mesh; None for any
        other claim (the worker runs candidate code: its word is checked here, and the runner
        checks the program against the task's per-chip inputs for that count)."""
        chips = stage_data(outcome).get("lower", {}).get("chips", 1)
        ok = isinstance(chips, int) and not isinstance(chips, bool) and chips in (1, task.chips)
        return chips if ok else None

    def _evaluate(self, source: str, task: SeedTask, prune_above_cycles: int | None = None
                  ) -> EvalResult:
        prov = self.provenance(task)
        source, entry = self._called(source, task)
        screened = screen_source(source, entry=entry, params=tuple(task.input_names),
                                 keywords=tuple(task.kernel_kwargs()))
        if not screened.ok:
            return EvalResult(Status.FAIL_SCREEN, error=screened.error, stage="screen", provenance=prov)
        reference = self.reference_timing(task)   # and the ground truth: before any candidate runs
        truth = self.references.truth(task)

        # 1. The jailed worker: trace once, ship the jaxpr as data.
        traced, program = self.children.trace(source, entry, task)
        metrics = Metrics(sandbox_time_s=traced.wall_time_s, worker_stage_seconds=json.dumps(traced.stage_seconds()))
        failed = self._failure(traced)
        if failed is None and program is None:
            failed = (Status.CRASH, "lower", "the worker finished without its traced program")
        chips = self._traced_chips(traced, task)
        if failed is None and chips is None:
            failed = (Status.FAIL_TRACE, "lower", f"refused: the worker claims a chip count the task "
                       f"({task.chips} chip(s)) does not offer")
        if failed is not None:
            status, stage, error = failed
            return EvalResult(status, error=error, stage=stage, metrics=metrics, provenance=prov,
                              log_tail=traced.output[-4000:])

        # 2. The trusted runner: lower both ways, audit, compile, run on the inputs.
        private = private_dir("run")
        try:
            path = private / PROGRAM_FILE
            path.write_bytes(program)
            input_dirs = write_inputs(private, task.input_names, [g.inputs for g in truth])
            prune = None
            if prune_above_cycles is not None and self.timing.prunable:
                prune = {"estimate_dir": str(private / "llo"), "above_cycles": int(prune_above_cycles)}
            public = self.references.write_timing_input(task, private / "timing_input")
            outcome = self.children.runner(private, task, "candidate", str(path), input_dirs, prune=prune,
                                           chips=chips, timing_input=public, known=self.same.known(task, chips))
            data = stage_data(outcome)
            if "same" in data and self._failure(outcome) is None:
                again = self.same.again(task, chips, str(data["same"].get("program_sha256")), outcome.wall_time_s,
                                        prune_above_cycles if prune is not None else None)
                if again is not None:     # this judgement's own time, not the earlier one's
                    return dataclasses.replace(again, metrics=dataclasses.replace(
                        again.metrics, sandbox_time_s=metrics.sandbox_time_s,
                        worker_stage_seconds=metrics.worker_stage_seconds,
                        runner_stage_seconds=json.dumps(outcome.stage_seconds())))
            compiled = data.get("compile", {})
            findings = data.get("audit", {}).get("findings", [])
            metrics = dataclasses.replace(
                metrics, vmem_bytes=compiled.get("vmem_bytes"), copy_trap=compiled.get("copy_trap"), chips=chips,
                compile_time_s=compiled.get("compile_time_s"), runner_time_s=outcome.wall_time_s,
                runner_stage_seconds=json.dumps(outcome.stage_seconds()),
                lower_time_s=data.get("audit", {}).get("lower_time_s"),
                constant_bytes=data.get("audit", {}).get("constant_bytes"),
                constant_computed_bytes=data.get("audit", {}).get("constant_computed_bytes"),
                program_sha256=data.get("audit", {}).get("program_sha256"),
                correctness_time_s=data.get("correctness", {}).get("correctness_time_s"),
                timing_time_s=data.get("timing", {}).get("timing_time_s"))
            failed = self._failure(outcome)
            if failed is not None:
                status, stage, error = failed
                return EvalResult(status, error=error, stage=stage, metrics=metrics, provenance=prov,
                                  log_tail=outcome.output[-4000:])
            if "prune" in data:
                return pruned(int(data["prune"]["cycles"]), prune_above_cycles, metrics, prov)

            # Correctness: this process compares the outputs with its own references.
            outputs = data.get("correctness", {}).get("outputs", [])
            if len(outputs) != len(truth):
                return EvalResult(Status.CRASH, error="the runner did not return every output",
                                  stage="correctness", metrics=metrics, provenance=prov)
            worst = (0.0, 0.0, 0.0)
            for i, g in enumerate(truth):
                try:
                    out = load_array(str(private / f"out{i}.npy"), outputs[i].get("dtype", ""))
                except (OSError, ValueError) as exc:
                    return EvalResult(Status.FAIL_CORRECTNESS, error=f"unreadable output: {exc}",
                                      stage="correctness", metrics=metrics, provenance=prov)
                cmp = compare_chips(out, g, task, chips, self.config.reference_error_factor)
                worst = (max(worst[0], cmp.max_abs_error or 0.0), max(worst[1], cmp.max_rel_error or 0.0),
                         max(worst[2], cmp.baseline_abs_error or 0.0))
                if not cmp.ok:
                    return EvalResult(Status.FAIL_CORRECTNESS, error=cmp.error + _dots_named(data) + _split_named(data),
                                      stage="correctness",
                                      metrics=dataclasses.replace(
                                          metrics, max_abs_error=cmp.max_abs_error,
                                          max_rel_error=cmp.max_rel_error,
                                          reference_max_abs_error=cmp.baseline_abs_error),
                                      provenance=prov)
            metrics = dataclasses.replace(metrics, max_abs_error=worst[0], max_rel_error=worst[1],
                                          reference_max_abs_error=worst[2])

            # Work the estimate cannot see is never counted as free.
            counted = COUNTED_ON_DATA if "cycles" in data.get("trips", {}) else ()    # trips.py counted them
            blind = [f for f in findings if f.get("construct") in self.timing.blind_spots
                     and f.get("construct") not in counted]
            if blind:
                return EvalResult(Status.FAIL_TIMING, stage="performance", metrics=metrics, provenance=prov,
                                  error="correct, but the compiler estimate cannot time it: " + "; ".join(
                                      f"{f['construct']} in {f['where']}: {f['detail']}" for f in blind))

            # Performance, by the same timing source for candidate and reference.
            timing = self.timing.read(private, data, self.chip)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        if timing.latency_s is None:
            return EvalResult(Status.FAIL_TIMING, error=timing.error, stage="performance",
                              metrics=metrics, provenance=prov)
        reference = self.reference_timing(task)
        work = task.measured_on(self.references.timing_arrays(task))    # the secret timing input's
        roof = roofline(work.flops, work.bytes_moved, timing.latency_s, self.chip, chips)
        speedup = (reference.latency_s / timing.latency_s) if reference.latency_s else None
        metrics = dataclasses.replace(
            metrics, latency_s=timing.latency_s, latency_ci_s=timing.ci_s, estimated_cycles=timing.cycles,
            reference_latency_s=reference.latency_s, reference_cycles=reference.cycles,
            speedup_vs_reference=speedup, tflops=roof.tflops, mxu_util=roof.mxu_util, hbm_bytes=timing.hbm_bytes,
            hbm_util=roof.hbm_util, regime=roof.regime, roofline_latency_s=roof.roofline_latency_s)
        if timing.latency_s < roof.roofline_latency_s * self.config.suspect_factor:
            return EvalResult(Status.SUSPECT, stage="metrics", metrics=metrics, provenance=prov, error=(
                f"latency {timing.latency_s:.3e} s is below the roofline bound "
                f"{roof.roofline_latency_s:.3e} s for this task on {self.chip.name}"))
        error = "" if reference.latency_s else reference.error
        return EvalResult(Status.PASS, error=error, stage="metrics", metrics=metrics, provenance=prov)


def _dots_named(data: dict) -> str:
    """What a correctness failure adds where the program holds f32 dots the TPU computes in bf16
    passes (``evaluator/correctness/precision.py``): the check computed them so too."""
    dots = data.get("audit", {}).get("reduced_dots") or []
    if not dots:
        return ""
    return (f"; the check computes f32 dots as the TPU's MXU does, and {len(dots)} dot(s) here run in bf16 "
            f"passes: {'; '.join(dots[:2])}; state precision=jax.lax.Precision.HIGHEST on a dot whose "
            "f32 result you need")


def _split_named(data: dict) -> str:
    """What a correctness failure adds where the check split "parallel" grid axes between a chip's
    two TensorCores (``evaluator/correctness/interpret.py``)."""
    split = data.get("correctness", {}).get("split_axes") or []
    if not split:
        return ""
    where = ", ".join(f"axis {axis} of {name}" for name, axis in split[:3])
    return (f"; this chip has two TensorCores and the check ran each \"parallel\" grid axis split between "
            f"them ({where}): an output that depends on which core ran which share, or on one core's "
            "scratch or writes reaching the other, is poison (NaN); mark such an axis \"arbitrary\"")
