"""The judge: screen -> lower -> compile -> correctness -> performance -> metrics.

Every candidate ends with exactly one ``Status`` in a frozen ``EvalResult``; nothing raises.
Candidate code runs only in sandboxed child processes (``sandbox.py``); the reference, the
inputs, the comparison and the verdict stay in this (trusted) process or in trusted children
that never load candidate code.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Sequence

import numpy as np

from evaluator.chips import Chip, get_chip
from evaluator.compare import compare, load_output
from evaluator.result import EvalResult, Metrics, Provenance, Status
from evaluator.roofline import roofline
from evaluator.sandbox import ChildOutcome, Limits, run_child
from evaluator.screen import screen_source
from evaluator.timing import Timing, TimingSource, get_timing_source
from evaluator.versions import versions
from seeds.flash_attention.task import CORRECTNESS_INPUTS, AttentionTask, make_inputs, reference_f32

_ROOT = Path(__file__).resolve().parent.parent
_REFERENCE_CACHE_FILE = "reference_timings.json"


@dataclasses.dataclass(frozen=True)
class StageBudgets:
    """Wall-clock seconds per stage, enforced from outside the child."""

    load_s: float = 60.0
    lower_s: float = 120.0
    compile_s: float = 300.0
    correctness_s: float = 600.0
    timing_s: float = 300.0

    def as_dict(self) -> dict[str, float]:
        return {"load": self.load_s, "lower": self.lower_s, "compile": self.compile_s,
                "correctness": self.correctness_s, "timing": self.timing_s}


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    chip: str = "v5e"
    timing: str = "auto"                 # "auto": measured on a TPU host, else compiler_estimate
    budgets: StageBudgets = StageBudgets()
    limits: Limits = Limits()
    correctness_inputs: tuple[tuple[str, int], ...] = CORRECTNESS_INPUTS
    workers: int = max(1, os.cpu_count() or 1)
    cache_dir: str | None = None         # reference timings; default ~/.cache/pallas-evolve
    entry: str = "flash_attention"
    suspect_factor: float = 1.0          # faster than roofline * factor -> SUSPECT

    def __post_init__(self) -> None:
        get_chip(self.chip)
        if self.timing not in ("auto", "compiler_estimate", "measured"):
            raise ValueError(f"unknown timing source {self.timing!r}; "
                             "use auto, compiler_estimate or measured")
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if not self.correctness_inputs:
            raise ValueError("correctness needs at least one input set")


def on_tpu_host() -> bool:
    """A TPU host has accelerator device nodes; PALLAS_EVOLVE_ON_TPU=0/1 overrides."""
    forced = os.environ.get("PALLAS_EVOLVE_ON_TPU")
    if forced is not None:
        return forced == "1"
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _first_lines(text: str, limit: int = 600) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    out = " | ".join(lines[:3])
    return out if len(out) <= limit else out[: limit - 3] + "..."


def classify_error(stage: str, kind: str, message: str) -> Status:
    low = message.lower()
    if "vmem" in low and any(k in low for k in ("resource_exhausted", "out of memory", "oom")):
        return Status.FAIL_VMEM
    if kind == "MemoryError" or any(k in low for k in ("bad_alloc", "cannot allocate memory")):
        return Status.OOM
    return {"load": Status.FAIL_LOWER, "lower": Status.FAIL_LOWER, "compile": Status.FAIL_COMPILE,
            "correctness": Status.FAIL_CORRECTNESS, "timing": Status.CRASH}.get(stage, Status.CRASH)


class Judge:
    """Evaluates kernel sources for one chip and timing source. Thread-safe; reuse it."""

    def __init__(self, config: JudgeConfig = JudgeConfig()) -> None:
        self.config = config
        self.chip: Chip = get_chip(config.chip)
        self.on_tpu = on_tpu_host()
        name = config.timing if config.timing != "auto" else (
            "measured" if self.on_tpu else "compiler_estimate")
        if name == "measured" and not self.on_tpu:
            raise ValueError("measured timing needs a TPU host; use --timing compiler_estimate")
        self.timing: TimingSource = get_timing_source(name)
        self.cache_dir = Path(config.cache_dir or Path.home() / ".cache" / "pallas-evolve")
        self._lock = threading.Lock()
        self._references: dict[str, Timing] = {}
        self._truth: dict[AttentionTask, list[tuple[tuple, np.ndarray]]] = {}

    # ---- provenance --------------------------------------------------------------------------
    def provenance(self) -> Provenance:
        v = versions()
        return Provenance(timing_source=self.timing.name, chip=self.chip.name,
                          jax_version=v["jax_version"], jaxlib_version=v["jaxlib_version"],
                          libtpu_version=v["libtpu_version"])

    # ---- trusted inputs and references --------------------------------------------------------
    def _ground_truth(self, task: AttentionTask) -> list[tuple[tuple, np.ndarray]]:
        with self._lock:
            if task not in self._truth:
                sets = []
                for dist, seed in self.config.correctness_inputs:
                    qkv = make_inputs(task, seed, dist)
                    sets.append((qkv, reference_f32(task, *qkv)))
                self._truth[task] = sets
            return self._truth[task]

    def _child_env(self, scratch: Path) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8",
            "PYTHONPATH": str(_ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            "TPU_ACCELERATOR_TYPE": self.chip.accelerator_type, "TPU_WORKER_HOSTNAMES": "localhost",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        if not self.on_tpu:
            # No chip to guard: let parallel workers load libtpu without its /tmp lockfile.
            env["JAX_PLATFORMS"] = "cpu"
            env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
        env.update(self.timing.worker_env(scratch))
        return env

    def _run_worker(self, scratch: Path, task: AttentionTask, mode: str,
                    kernel_path: str | None, input_dirs: list[str]) -> ChildOutcome:
        request = {"mode": mode, "kernel_path": kernel_path, "entry": self.config.entry,
                   "task": dataclasses.asdict(task), "chip": self.chip.name,
                   "topology": self.chip.topology, "on_tpu": self.on_tpu, "inputs": input_dirs,
                   "out_dir": str(scratch), "timing": self.timing.worker_request()}
        (scratch / "request.json").write_text(json.dumps(request))
        outcome = run_child([sys.executable, "-m", "evaluator.worker", str(scratch / "request.json")],
                            cwd=str(scratch), env=self._child_env(scratch),
                            budgets=self.config.budgets.as_dict(),
                            default_budget=self.config.budgets.load_s, limits=self.config.limits)
        if self.on_tpu and outcome.returncode != 0:
            Path("/tmp/libtpu_lockfile").unlink(missing_ok=True)   # a killed worker's leftover
        return outcome

    def reference_timing(self, task: AttentionTask) -> Timing:
        """The task's plain XLA program, compiled for the same chip, timed by the same source."""
        key = f"{task.key}|{self.chip.name}|{self.timing.name}|libtpu={versions()['libtpu_version']}"
        cache_file = self.cache_dir / _REFERENCE_CACHE_FILE
        with self._lock:
            if key in self._references:
                return self._references[key]
            persistent = self.timing.name == "compiler_estimate"   # deterministic: safe to keep
            if persistent and cache_file.is_file():
                try:
                    cached = json.loads(cache_file.read_text()).get(key)
                except (OSError, ValueError):
                    cached = None
                if cached:
                    self._references[key] = Timing(cached["latency_s"], cycles=cached.get("cycles"))
                    return self._references[key]
            scratch = Path(tempfile.mkdtemp(prefix="pallas-evolve-ref-"))
            try:
                inputs = self._write_inputs(scratch, task, limit=1) if self.on_tpu else []
                outcome = self._run_worker(scratch, task, "reference", None, inputs)
                errors = [e for e in outcome.events if e.get("event") == "error"]
                if errors or not any(e.get("event") == "done" for e in outcome.events):
                    detail = errors[0]["message"] if errors else _first_lines(outcome.output[-2000:])
                    return Timing(None, error=f"the reference failed to compile: {detail}")
                timing = self.timing.read(scratch, self._stage_data(outcome), self.chip)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if timing.latency_s is not None:
                self._references[key] = timing
                if persistent:
                    self._store_reference(cache_file, key, timing)
            return timing

    def _store_reference(self, cache_file: Path, key: str, timing: Timing) -> None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            data = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
            data[key] = {"latency_s": timing.latency_s, "cycles": timing.cycles}
            tmp = cache_file.with_name(f"_{cache_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, cache_file)
        except (OSError, ValueError):
            pass   # a cache, nothing more

    def _write_inputs(self, scratch: Path, task: AttentionTask, limit: int | None = None) -> list[str]:
        dirs = []
        for i, (qkv, _) in enumerate(self._ground_truth(task)[:limit]):
            d = scratch / f"inputs{i}"
            d.mkdir()
            for name, array in zip(("q", "k", "v"), qkv):
                stored = array.view(np.uint16) if task.dtype == "bfloat16" else array
                np.save(d / f"{name}.npy", stored, allow_pickle=False)
            dirs.append(str(d))
        return dirs

    @staticmethod
    def _stage_data(outcome: ChildOutcome) -> dict[str, dict]:
        return {e["stage"]: e.get("data") or {} for e in outcome.events
                if e.get("event") == "stage_ok" and "stage" in e}

    # ---- the pipeline ---------------------------------------------------------------------------
    def evaluate(self, source: str, task: AttentionTask) -> EvalResult:
        """Judge one kernel source. Never raises."""
        start = time.monotonic()
        try:
            result = self._evaluate(source, task)
        except Exception as exc:  # noqa: BLE001 - a judge bug must not kill a run
            result = EvalResult(Status.CRASH, error=f"internal judge error: {type(exc).__name__}: {exc}",
                                stage="judge", provenance=self.provenance())
        return dataclasses.replace(result, wall_time_s=time.monotonic() - start)

    def evaluate_many(self, sources: Sequence[str], task: AttentionTask) -> list[EvalResult]:
        """Judge several sources in parallel, one sandboxed worker per core."""
        if not sources:
            return []
        self.reference_timing(task)      # once, before the workers start
        self._ground_truth(task)
        with concurrent.futures.ThreadPoolExecutor(self.config.workers) as pool:
            return list(pool.map(lambda s: self.evaluate(s, task), sources))

    def _evaluate(self, source: str, task: AttentionTask) -> EvalResult:
        prov = self.provenance()
        screened = screen_source(source, entry=self.config.entry)
        if not screened.ok:
            return EvalResult(Status.FAIL_SCREEN, error=screened.error, stage="screen", provenance=prov)

        truth = self._ground_truth(task)
        scratch = Path(tempfile.mkdtemp(prefix="pallas-evolve-"))
        try:
            kernel_path = scratch / "kernel.py"
            kernel_path.write_text(source)
            input_dirs = self._write_inputs(scratch, task)
            outcome = self._run_worker(scratch, task, "candidate", str(kernel_path), input_dirs)
            data = self._stage_data(outcome)
            compiled = data.get("compile", {})
            metrics = Metrics(vmem_bytes=compiled.get("vmem_bytes"), copy_trap=compiled.get("copy_trap"),
                              compile_time_s=compiled.get("compile_time_s"))
            failure = self._failure(outcome)
            if failure is not None:
                status, stage, error = failure
                return EvalResult(status, error=error, stage=stage, metrics=metrics, provenance=prov,
                                  log_tail=outcome.output[-4000:])

            # Correctness: the parent reads the outputs and compares them with its own reference.
            atol, rtol = task.tolerance
            outputs = data.get("correctness", {}).get("outputs", [])
            if len(outputs) != len(truth):
                return EvalResult(Status.CRASH, error="the worker did not return every output",
                                  stage="correctness", metrics=metrics, provenance=prov)
            worst_abs, worst_rel = 0.0, 0.0
            for i, ((_, ref), (dist, seed)) in enumerate(zip(truth, self.config.correctness_inputs)):
                try:
                    out = load_output(str(scratch / f"out{i}.npy"), outputs[i].get("dtype", ""))
                except (OSError, ValueError) as exc:
                    return EvalResult(Status.FAIL_CORRECTNESS, error=f"unreadable output: {exc}",
                                      stage="correctness", metrics=metrics, provenance=prov)
                cmp = compare(out, ref, expected_dtype=task.dtype, atol=atol, rtol=rtol,
                              label=f"input {dist} seed {seed}")
                worst_abs = max(worst_abs, cmp.max_abs_error or 0.0)
                worst_rel = max(worst_rel, cmp.max_rel_error or 0.0)
                if not cmp.ok:
                    return EvalResult(Status.FAIL_CORRECTNESS, error=cmp.error, stage="correctness",
                                      metrics=dataclasses.replace(metrics, max_abs_error=cmp.max_abs_error,
                                                                  max_rel_error=cmp.max_rel_error),
                                      provenance=prov)
            metrics = dataclasses.replace(metrics, max_abs_error=worst_abs, max_rel_error=worst_rel)

            # Performance, by the same timing source for candidate and reference.
            timing = self.timing.read(scratch, data, self.chip)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if timing.latency_s is None:
            return EvalResult(Status.FAIL_TIMING, error=timing.error, stage="performance",
                              metrics=metrics, provenance=prov)
        reference = self.reference_timing(task)
        roof = roofline(task.flops, task.bytes_moved, timing.latency_s, self.chip)
        speedup = (reference.latency_s / timing.latency_s) if reference.latency_s else None
        metrics = dataclasses.replace(
            metrics, latency_s=timing.latency_s, latency_ci_s=timing.ci_s, estimated_cycles=timing.cycles,
            reference_latency_s=reference.latency_s, reference_cycles=reference.cycles,
            speedup_vs_reference=speedup, tflops=roof.tflops, mxu_util=roof.mxu_util,
            hbm_util=roof.hbm_util, regime=roof.regime, roofline_latency_s=roof.roofline_latency_s)
        if timing.latency_s < roof.roofline_latency_s * self.config.suspect_factor:
            return EvalResult(Status.SUSPECT, stage="metrics", metrics=metrics, provenance=prov, error=(
                f"latency {timing.latency_s:.3e} s is below the roofline bound "
                f"{roof.roofline_latency_s:.3e} s for this task on {self.chip.name}"))
        error = "" if reference.latency_s else reference.error
        return EvalResult(Status.PASS, error=error, stage="metrics", metrics=metrics, provenance=prov)

    def _failure(self, outcome: ChildOutcome) -> tuple[Status, str, str] | None:
        """The status of a worker that did not finish cleanly, or None if it did."""
        if outcome.timed_out_stage:
            stage = outcome.timed_out_stage
            budget = self.config.budgets.as_dict().get(stage, self.config.budgets.load_s)
            return Status.TIMEOUT, stage, (f"stage '{stage}' ran past its budget of {budget:g} s "
                                           "and the worker's process group was killed")
        errors = [e for e in outcome.events if e.get("event") == "error"]
        if errors:
            e = errors[0]
            stage, kind, message = str(e.get("stage")), str(e.get("kind")), str(e.get("message"))
            return classify_error(stage, kind, message), stage, _first_lines(message)
        stages = [e.get("stage") for e in outcome.events if e.get("event") == "stage"]
        stage = str(stages[-1]) if stages else "start"
        if outcome.signal is not None:
            name = _signal_name(outcome.signal)
            if outcome.signal == signal.SIGKILL:
                return Status.OOM, stage, f"worker killed by {name} during '{stage}' (the OOM killer?)"
            low = outcome.output.lower()
            if "bad_alloc" in low or "out of memory" in low:
                return Status.OOM, stage, f"worker ran out of memory during '{stage}' ({name})"
            return Status.CRASH, stage, f"worker died from signal {name} ({outcome.signal}) during '{stage}'"
        if not any(e.get("event") == "done" for e in outcome.events):
            tail = _first_lines(outcome.output[-1500:])
            return Status.CRASH, stage, (f"worker exited with status {outcome.returncode} during "
                                         f"'{stage}' without a result" + (f": {tail}" if tail else ""))
        return None


def evaluate(source: str, task: AttentionTask | None = None, chip: str = "v5e",
             config: JudgeConfig | None = None) -> EvalResult:
    """Judge one kernel source on ``task`` (default: the seed's default task)."""
    config = config or JudgeConfig(chip=chip)
    try:
        judge = Judge(config)
    except ValueError as exc:
        return EvalResult(Status.CRASH, error=str(exc), stage="judge")
    return judge.evaluate(source, task or AttentionTask())
