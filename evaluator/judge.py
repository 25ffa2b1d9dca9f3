"""The judge: screen -> trace -> audit -> compile -> correctness -> performance -> metrics.

Every candidate ends with exactly one ``Status`` in a frozen ``EvalResult``; nothing raises.

Two children per candidate, one after the other:

1. the **worker** (``worker.py``), the only process that runs candidate code: jailed
   (``jail.py``: own PID, network and mount namespaces, user ``nobody``, only its scratch
   directory writable), it traces the candidate once and ships that jaxpr as data (``wire.py``).
   It never lowers a program and never sees the inputs.
2. the **runner** (``runner.py``), trusted code only (jailed too off a TPU host), started after
   the worker's namespace is gone: it rebuilds the jaxpr from data, lowers it for the TPU and for
   the CPU interpreter (``traced.py``), audits both (``kernel_audit.py``), compiles the TPU
   program with the profile dump in a directory of its own, and runs the CPU program on the
   inputs.

The reference, the inputs, the comparison and the verdict stay in this process.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import inspect
import glob
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Sequence

import numpy as np

from evaluator import jail, wire
from evaluator.chips import Chip, get_chip
from evaluator.arrays import load_array, save_array
from evaluator.compare import Comparison, compare
from evaluator.constants import BUDGET_BYTES
from evaluator.ground_truth import GroundTruth, InputSets, draw, timing_input
from evaluator.result import EvalResult, Metrics, Provenance, Status
from evaluator.roofline import roofline
from evaluator.sandbox import ChildOutcome, Limits, run_child
from evaluator.screen import screen_source
from evaluator.timing import Timing, TimingSource, get_timing_source
from evaluator.versions import versions
from evaluator.worker import PROGRAM_FILE
from seeds import SeedTask, task_source

_ROOT = Path(__file__).resolve().parent.parent
_REFERENCE_CACHE_FILE = "reference_timings.json"
# Constructs that cannot be one checked-and-timed program, whatever times it: refused outright.
TRACE_REFUSALS = ("host_callback", "unknown_custom_call", "effects", "multi_platform")
# Constructs the compiler's static estimate cannot count: such a kernel may be correct, but its
# estimate is not a figure (FAIL_TIMING naming the construct). A measured time counts them.
ESTIMATE_BLIND_SPOTS = ("data_dependent_loop", "data_dependent_branch", "xla_loop", "xla_branch",
                        "unparsed_kernel")
_WARNED: set[str] = set()
# "auto": measured on a TPU host, else the compiler estimate.
TIMING_CHOICES = ("auto", "compiler_estimate", "measured")
# Which chips of a TPU host a process may use, as a scheduler (Ray) sets them for one task: passed
# on to the runner, so that a judge given one chip times on that chip alone.
CHIP_VISIBILITY_ENV = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")
# libtpu 0.0.42.1: "Static LLO profiling of <op> failed: INVALID_ARGUMENT: Unsupported DMA direction ..."
_PROFILER_FAILURE = re.compile(r"(Static LLO profiling of \S+ failed:[^\n]*)")


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
    # (distribution, PRNG seed) per input set, public; None: the task's distributions, each with a
    # secret seed drawn by the judge from the OS (ground_truth.py), the default.
    correctness_inputs: tuple[tuple[str, int], ...] | None = None
    workers: int = max(1, os.cpu_count() or 1)
    cache_dir: str | None = None         # reference timings; default ~/.cache/pallas-evolve
    entry: str | None = None             # the kernel's entry point; None: the task's
    suspect_factor: float = 1.0          # faster than roofline * factor -> SUSPECT
    # A candidate's error may be at most this multiple of the task's own XLA program's error.
    reference_error_factor: float = 1.5
    # Bytes of constants a candidate's program may carry (evaluator/constants.py).
    constant_budget_bytes: int = BUDGET_BYTES

    def __post_init__(self) -> None:
        get_chip(self.chip)
        if self.timing not in TIMING_CHOICES:
            raise ValueError(f"unknown timing source {self.timing!r}; "
                             "use auto, compiler_estimate or measured")
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if self.correctness_inputs is not None and not self.correctness_inputs:
            raise ValueError("correctness needs at least one input set")


def _private_dir(kind: str) -> Path:
    """A directory only this user can reach (mkdtemp makes it 0700), for trusted children."""
    return Path(tempfile.mkdtemp(prefix=f"pallas-evolve-{kind}-"))


def _read_regular(path: Path, limit: int) -> bytes | None:
    """A file the jailed worker left behind, read as data: no symlinks, no devices, bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(limit)
    finally:
        os.close(fd)


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
    if kind == "KnobRefused":      # a compiler parameter the judge does not model (compiler_params.py)
        return Status.FAIL_TIMING
    if kind in ("Refused", "WireError"):
        return Status.FAIL_TRACE
    return {"load": Status.FAIL_LOWER, "lower": Status.FAIL_LOWER, "compile": Status.FAIL_COMPILE,
            "correctness": Status.FAIL_CORRECTNESS, "timing": Status.CRASH}.get(stage, Status.CRASH)


@functools.cache
def _code_digest(task_class: type) -> str:
    """A short hash of the source file that defines ``task_class`` (its reference program)."""
    try:
        path = inspect.getsourcefile(task_class)
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else "unknown"
    except (OSError, TypeError):
        return "unknown"


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
        self.isolation = jail.probe()
        if not self.isolation.enabled and "jail" not in _WARNED:
            _WARNED.add("jail")
            print(f"WARNING: candidate code will run WITHOUT operating-system isolation "
                  f"({self.isolation.reason}); only process limits and the source screen stand "
                  "between a candidate and this machine.", file=sys.stderr)
        self._lock = threading.Lock()
        self._references: dict[str, Timing] = {}
        self._truth: dict[SeedTask, list[GroundTruth]] = {}
        self._small_inputs: dict[SeedTask, dict[str, np.ndarray]] = {}

    # ---- provenance --------------------------------------------------------------------------
    def source_label(self, task: SeedTask | None = None) -> str:
        """What this judge's figures on ``task`` are called. A task with a mesh adds the ICI model
        (``evaluator/ici_model.py``) to every figure, a 1-chip candidate's (no collective) included,
        so that all the figures of one task are one model and no other figure is compared with them."""
        label = self.timing.label or self.timing.name
        if task is not None and task.chips > 1 and self.timing.name == "compiler_estimate":
            label += "+ici_model"
        return label

    def provenance(self, task: SeedTask | None = None) -> Provenance:
        v = versions()
        sets = secret = None
        if task is not None:
            sets = len(self.config.correctness_inputs or task.correctness_inputs)
            secret = 0 if self.config.correctness_inputs else sets
        return Provenance(timing_source=self.source_label(task), chip=self.chip.name,
                          jax_version=v["jax_version"], jaxlib_version=v["jaxlib_version"],
                          libtpu_version=v["libtpu_version"], correctness_sets=sets, secret_sets=secret)

    # ---- children --------------------------------------------------------------------------------
    def _base_env(self, home: Path) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "TMPDIR": str(home), "LANG": "C.UTF-8", "PYTHONPATH": str(_ROOT),
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}

    def _child_env(self, scratch: Path) -> dict[str, str]:
        """The jailed worker only traces and exports: no TPU, no libtpu flags, no timing."""
        return dict(self._base_env(scratch), JAX_PLATFORMS="cpu")

    def _runner_env(self, private: Path) -> dict[str, str]:
        env = dict(self._base_env(private), TPU_ACCELERATOR_TYPE=self.chip.accelerator_type,
                   TPU_WORKER_HOSTNAMES="localhost")
        if not self.on_tpu:
            # No chip to guard: let parallel runners load libtpu without its /tmp lockfile.
            env["JAX_PLATFORMS"] = "cpu"
            env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
        else:
            env.update({k: os.environ[k] for k in CHIP_VISIBILITY_ENV if k in os.environ})
        env.update(self.timing.worker_env(private))
        return env

    def _run(self, module: str, directory: Path, request: dict, env: dict[str, str], *,
             jailed: bool, total_budget: float | None = None) -> ChildOutcome:
        (directory / "request.json").write_text(json.dumps(request))
        argv = [sys.executable, "-m", module, str(directory / "request.json")]
        if jailed:
            argv = self.isolation.wrap(argv, str(directory))
        budgets = self.config.budgets
        return run_child(argv, cwd=str(directory), env=env, budgets=budgets.as_dict(),
                         default_budget=budgets.load_s, limits=self.config.limits,
                         total_budget=total_budget)

    def _run_runner(self, private: Path, task: SeedTask, mode: str, program: str | None,
                    input_dirs: list[str], compile_tpu: bool = True, prune: dict | None = None,
                    timing_input: str | None = None, chips: int = 1) -> ChildOutcome:
        request = {"mode": mode, "program": program, "task": task.fields(), "task_source": task_source(task),
                   "specs": task.input_specs(), "input_names": list(task.input_names),
                   "topology": self.chip.topology, "on_tpu": self.on_tpu, "inputs": input_dirs,
                   # whose values data-dependent index maps are evaluated on (the HBM traffic model)
                   "timing_input": timing_input,
                   "out_dir": str(private), "timing": self.timing.worker_request(),
                   "refuse": list(TRACE_REFUSALS), "compile": compile_tpu, "prune": prune,
                   "constant_budget": self.config.constant_budget_bytes,
                   "chips": chips, "mesh_axis": task.mesh_axis,
                   "chip_specs": task.chip_specs(chips) if chips > 1 else None}
        # Defence in depth: the runner parses programs a candidate produced. Off a TPU host it is
        # jailed too (it needs no device); its private dir is hidden from workers by their mounts.
        jailed = self.isolation.enabled and not self.on_tpu
        if jailed:
            os.chown(private, jail.NOBODY, jail.NOBODY)
        env = self._runner_env(private)
        if chips > 1 and not self.on_tpu:     # the per-chip program is checked on as many CPU devices
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={chips}"
        elif chips > 1:                       # it runs on the host's chips: not one scheduler's chip
            for key in CHIP_VISIBILITY_ENV:
                env.pop(key, None)
        outcome = self._run("evaluator.runner", private, request, env, jailed=jailed)
        if self.on_tpu and outcome.returncode != 0:
            Path("/tmp/libtpu_lockfile").unlink(missing_ok=True)   # a killed runner's leftover
        return outcome

    # ---- trusted inputs and references --------------------------------------------------------
    def _ground_truth(self, task: SeedTask) -> list[GroundTruth]:
        """Inputs, the f32 truth, and the task's XLA program's outputs: made before any candidate
        runs, kept in this process."""
        with self._lock:
            if task not in self._truth:
                self._truth[task] = self._make_ground_truth(task)
            return self._truth[task]

    def _make_ground_truth(self, task: SeedTask) -> list[GroundTruth]:
        drawn: InputSets = draw(task, self.config.correctness_inputs)
        sets = [GroundTruth(label, inputs, task.reference(*inputs)) for label, inputs in drawn.sets]
        timing = self._cached_reference(task)
        private = _private_dir("ref")
        try:
            inputs = self._write_inputs(private, task.input_names, [g.inputs for g in sets])
            outcome = self._run_runner(private, task, "reference", None, inputs,
                                       compile_tpu=timing is None or self.on_tpu)
            failure = self._failure(outcome)
            if failure is not None:
                raise RuntimeError(f"the task's reference program failed: {failure[2]}")
            data = self._stage_data(outcome)
            outputs = data["correctness"]["outputs"]
            sets = [dataclasses.replace(g, program_out=load_array(str(private / f"out{i}.npy"),
                                                                   outputs[i]["dtype"]))
                    for i, g in enumerate(sets)]
            if timing is None:
                timing = self.timing.read(private, data, self.chip)
                if timing.latency_s is not None:
                    self._store_reference(task, timing)
            self._references[self._reference_key(task)] = timing
        finally:
            shutil.rmtree(private, ignore_errors=True)
        return sets

    def _reference_key(self, task: SeedTask) -> str:
        """What a stored reference timing depends on: the task, the chip, the timing source, the
        versions, and the task's own code (a changed reference program is timed again)."""
        source = self.source_label(task)
        v = versions()
        return (f"{task.key}|{self.chip.name}|{source}|libtpu={v['libtpu_version']}|jax={v['jax_version']}"
                f"|task={_code_digest(type(task))}")

    def ground_truth(self, task: SeedTask) -> tuple[Timing, list[GroundTruth]]:
        """The task's reference timing and ground truth, made here once (for a judge elsewhere)."""
        truth = self._ground_truth(task)
        return self._references[self._reference_key(task)], truth

    def adopt(self, task: SeedTask, reference: Timing, truth: Sequence[GroundTruth]) -> None:
        """Take another judge's reference timing and ground truth for ``task`` (same chip, timing
        source and versions): this judge then never times the reference or makes the inputs itself."""
        with self._lock:
            self._truth[task] = list(truth)
            self._references[self._reference_key(task)] = reference

    def reference_timing(self, task: SeedTask) -> Timing:
        """The task's plain XLA program, compiled for the same chip, timed by the same source."""
        try:
            self._ground_truth(task)
        except RuntimeError as exc:
            return Timing(None, error=str(exc))
        return self._references[self._reference_key(task)]

    def _cached_reference(self, task: SeedTask) -> Timing | None:
        """A stored reference timing, trusted only if the file is ours alone and the entry is sane.
        Only the deterministic compiler estimate is stored."""
        if self.timing.name != "compiler_estimate":
            return None
        cache_file = self.cache_dir / _REFERENCE_CACHE_FILE
        try:
            for path in (cache_file.parent, cache_file):
                st = path.stat()
                if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    print(f"WARNING: ignoring {cache_file}: {path} is not owned by this user alone "
                          "(writable by others); the reference is recompiled", file=sys.stderr)
                    return None
            entry = json.loads(cache_file.read_text()).get(self._reference_key(task))
        except (OSError, ValueError, AttributeError):
            return None
        try:
            cycles, latency = int(entry["cycles"]), float(entry["latency_s"])
        except (TypeError, KeyError, ValueError):
            return None
        if cycles <= 0 or abs(latency - cycles / self.chip.clock_hz) > 1e-9 * latency:
            return None
        return Timing(latency, cycles=cycles)

    def _store_reference(self, task: SeedTask, timing: Timing) -> None:
        cache_file = self.cache_dir / _REFERENCE_CACHE_FILE
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            data = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
            data[self._reference_key(task)] = {"latency_s": timing.latency_s, "cycles": timing.cycles}
            tmp = cache_file.with_name(f"_{cache_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.chmod(tmp, 0o600)
            os.replace(tmp, cache_file)
        except (OSError, ValueError):
            pass   # a cache, nothing more

    @staticmethod
    def _write_inputs(directory: Path, names: Sequence[str], sets: list[tuple]) -> list[str]:
        dirs = []
        for i, arrays in enumerate(sets):
            d = directory / f"inputs{i}"
            d.mkdir()
            for name, array in zip(names, arrays, strict=True):
                save_array(d / f"{name}.npy", array)
            dirs.append(str(d))
        return dirs

    @staticmethod
    def _stage_data(outcome: ChildOutcome) -> dict[str, dict]:
        return {e["stage"]: e.get("data") or {} for e in outcome.events
                if e.get("event") == "stage_ok" and "stage" in e}

    # ---- the pipeline ---------------------------------------------------------------------------
    def evaluate(self, source: str, task: SeedTask, *, prune_above_cycles: int | None = None
                 ) -> EvalResult:
        """Judge one kernel source. Never raises.

        ``prune_above_cycles`` turns on the cascade (compiler estimate only): a kernel whose
        estimate is over it ends ``PRUNED`` after the compile, without the correctness stage,
        with its estimate recorded but no latency, no speedup and so no fitness."""
        start = time.monotonic()
        try:
            result = self._evaluate(source, task, prune_above_cycles)
        except Exception as exc:  # noqa: BLE001 - a judge bug must not kill a run
            result = EvalResult(Status.CRASH, error=f"internal judge error: {type(exc).__name__}: {exc}",
                                stage="judge", provenance=self.provenance(task))
        return dataclasses.replace(result, wall_time_s=time.monotonic() - start)

    def estimate(self, source: str, task: SeedTask) -> tuple[int | None, list[dict], str]:
        """The compiler's estimate of a source, with the audit's findings, and no correctness
        check: (cycles or None, findings, why there is no figure). For sweeps and measurements
        of trusted kernels (scripts/); a candidate's figure only ever comes from ``evaluate``."""
        timing, findings = self.estimate_timing(source, task)
        return timing.cycles, findings, timing.error

    def estimate_timing(self, source: str | None, task: SeedTask) -> tuple[Timing, list[dict]]:
        """:meth:`estimate` as a Timing (with its compute and HBM parts); ``source`` None: the
        task's own XLA program (trusted), without running it on the CPU."""
        program = None
        if source is not None:
            outcome, program = self._trace(source, task)
            failure = self._failure(outcome)
            if failure is not None or program is None:
                return Timing(None, error=failure[2] if failure else "the worker exported nothing"), []
        private = _private_dir("estimate")
        try:
            path = private / PROGRAM_FILE
            if program is not None:
                path.write_bytes(program)
            small = self._timing_input(task, private / "timing_input")
            chips = self._traced_chips(outcome, task) if program is not None else 1
            if chips is None:
                return Timing(None, error=f"the worker claims a chip count the task ({task.chips}) does not offer"), []
            run = self._run_runner(private, task, "candidate" if program is not None else "reference",
                                   str(path) if program is not None else None, [], timing_input=small,
                                   chips=chips)
            failure = self._failure(run)
            if failure is not None:
                return Timing(None, error=failure[2]), []
            data = self._stage_data(run)
            return self.timing.read(private, data, self.chip), data.get("audit", {}).get("findings", [])
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def _timing_input(self, task: SeedTask, directory: Path) -> str:
        """The public timing input's arrays (``ground_truth.timing_input``: small integers such as
        cache lengths) written to ``directory``, for index maps that read them."""
        with self._lock:
            if task not in self._small_inputs:
                self._small_inputs[task] = timing_input(task, self.config.correctness_inputs)
            arrays = self._small_inputs[task]
        directory.mkdir()
        for name, array in arrays.items():
            save_array(directory / f"{name}.npy", array)
        return str(directory)

    def evaluate_many(self, sources: Sequence[str], task: SeedTask, *,
                      prune_above_cycles: int | None = None) -> list[EvalResult]:
        """Judge several sources in parallel, one sandboxed worker per core."""
        if not sources:
            return []
        self.reference_timing(task)      # once, before any candidate runs
        with concurrent.futures.ThreadPoolExecutor(self.config.workers) as pool:
            return list(pool.map(lambda s: self.evaluate(s, task, prune_above_cycles=prune_above_cycles),
                                 sources))

    def _traced_chips(self, outcome: ChildOutcome, task: SeedTask) -> int | None:
        """The chip count the worker traced the candidate for: 1, or the task's mesh; None for any
        other claim (the worker runs candidate code: its word is checked here, and the runner
        checks the program against the task's per-chip inputs for that count)."""
        chips = self._stage_data(outcome).get("lower", {}).get("chips", 1)
        ok = isinstance(chips, int) and not isinstance(chips, bool) and chips in (1, task.chips)
        return chips if ok else None

    def _trace(self, source: str, task: SeedTask) -> tuple[ChildOutcome, bytes | None]:
        """Run the candidate in the jail; return what it said and the jaxpr it traced (as data)."""
        scratch = Path(tempfile.mkdtemp(prefix="pallas-evolve-cand-"))
        try:
            (scratch / "kernel.py").write_text(source)
            if self.isolation.enabled:
                os.chown(scratch, jail.NOBODY, jail.NOBODY)
            request = {"kernel_path": str(scratch / "kernel.py"), "entry": self.config.entry or task.entry,
                       "specs": task.input_specs(), "kwargs": task.kernel_kwargs(), "out_dir": str(scratch)}
            if task.chips > 1:     # a candidate may use the whole mesh (CHIPS = task.chips)
                request["mesh"] = {"axis": task.mesh_axis, "specs": {str(task.chips): task.chip_specs(task.chips)}}
            # The worker only loads and traces: it gets those two budgets, in all.
            budgets = self.config.budgets
            outcome = self._run("evaluator.worker", scratch, request, self._child_env(scratch),
                                jailed=True, total_budget=budgets.load_s + budgets.lower_s)
            return outcome, _read_regular(scratch / PROGRAM_FILE, wire.MAX_BYTES)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _evaluate(self, source: str, task: SeedTask, prune_above_cycles: int | None = None
                  ) -> EvalResult:
        prov = self.provenance(task)
        screened = screen_source(source, entry=self.config.entry or task.entry, params=tuple(task.input_names),
                                 keywords=tuple(task.kernel_kwargs()))
        if not screened.ok:
            return EvalResult(Status.FAIL_SCREEN, error=screened.error, stage="screen", provenance=prov)
        reference = self.reference_timing(task)   # and the ground truth: before any candidate runs
        truth = self._ground_truth(task)

        # 1. The jailed worker: trace once, ship the jaxpr as data.
        traced, program = self._trace(source, task)
        metrics = Metrics(sandbox_time_s=traced.wall_time_s)
        failure = self._failure(traced)
        if failure is None and program is None:
            failure = (Status.CRASH, "lower", "the worker finished without its traced program")
        chips = self._traced_chips(traced, task)
        if failure is None and chips is None:
            failure = (Status.FAIL_TRACE, "lower", f"refused: the worker claims a chip count the task "
                       f"({task.chips} chip(s)) does not offer")
        if failure is not None:
            status, stage, error = failure
            return EvalResult(status, error=error, stage=stage, metrics=metrics, provenance=prov,
                              log_tail=traced.output[-4000:])

        # 2. The trusted runner: lower both ways, audit, compile, run on the inputs.
        private = _private_dir("run")
        try:
            path = private / PROGRAM_FILE
            path.write_bytes(program)
            input_dirs = self._write_inputs(private, task.input_names, [g.inputs for g in truth])
            prune = None
            if prune_above_cycles is not None and self.timing.name == "compiler_estimate":
                prune = {"estimate_dir": str(private / "llo"), "above_cycles": int(prune_above_cycles)}
            outcome = self._run_runner(private, task, "candidate", str(path), input_dirs, prune=prune,
                                       chips=chips, timing_input=self._timing_input(task, private / "timing_input"))
            data = self._stage_data(outcome)
            compiled = data.get("compile", {})
            findings = data.get("audit", {}).get("findings", [])
            metrics = dataclasses.replace(
                metrics, vmem_bytes=compiled.get("vmem_bytes"), copy_trap=compiled.get("copy_trap"), chips=chips,
                compile_time_s=compiled.get("compile_time_s"), runner_time_s=outcome.wall_time_s,
                lower_time_s=data.get("audit", {}).get("lower_time_s"),
                constant_bytes=data.get("audit", {}).get("constant_bytes"),
                constant_computed_bytes=data.get("audit", {}).get("constant_computed_bytes"),
                correctness_time_s=data.get("correctness", {}).get("correctness_time_s"),
                timing_time_s=data.get("timing", {}).get("timing_time_s"))
            failure = self._failure(outcome)
            if failure is not None:
                status, stage, error = failure
                return EvalResult(status, error=error, stage=stage, metrics=metrics, provenance=prov,
                                  log_tail=outcome.output[-4000:])
            if "prune" in data:
                cycles = int(data["prune"]["cycles"])
                return EvalResult(Status.PRUNED, stage="prune", provenance=prov, error=(
                    f"estimated {cycles:,} cycles, over the cut of {prune_above_cycles:,}: too slow to "
                    "matter, so it was not checked for correctness and has no speed"),
                    metrics=dataclasses.replace(metrics, estimated_cycles=cycles))

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
                cmp = self._compare_chips(out, g, task, chips)
                worst = (max(worst[0], cmp.max_abs_error or 0.0), max(worst[1], cmp.max_rel_error or 0.0),
                         max(worst[2], cmp.baseline_abs_error or 0.0))
                if not cmp.ok:
                    return EvalResult(Status.FAIL_CORRECTNESS, error=cmp.error, stage="correctness",
                                      metrics=dataclasses.replace(
                                          metrics, max_abs_error=cmp.max_abs_error,
                                          max_rel_error=cmp.max_rel_error,
                                          reference_max_abs_error=cmp.baseline_abs_error),
                                      provenance=prov)
            metrics = dataclasses.replace(metrics, max_abs_error=worst[0], max_rel_error=worst[1],
                                          reference_max_abs_error=worst[2])

            # Work the estimate cannot see is never counted as free.
            blind = [f for f in findings if f.get("construct") in ESTIMATE_BLIND_SPOTS]
            if blind and self.timing.name == "compiler_estimate":
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
        roof = roofline(task.flops, task.bytes_moved, timing.latency_s, self.chip, chips)
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

    def _compare_chips(self, out: np.ndarray, truth: GroundTruth, task: SeedTask, chips: int):
        """The output against the truth; a per-chip program's output is every chip's, and every
        chip must hold the right answer (the first that does not is the verdict)."""
        atol, rtol = task.tolerance
        kwargs = dict(expected_dtype=task.output_dtype, atol=atol, rtol=rtol, baseline=truth.program_out,
                      baseline_factor=self.config.reference_error_factor)
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
        profiler = _PROFILER_FAILURE.search(outcome.output)
        if outcome.signal is not None and profiler:
            # libtpu's static profiler aborts the whole compile on some DMA patterns: the kernel
            # may be fine, but the estimate has no figure for it (never counted as free).
            return Status.FAIL_TIMING, stage, (f"the compiler's static profiler cannot estimate this kernel "
                                               f"({profiler.group(1).strip()[:200]}); time it on a TPU host")
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


def evaluate(source: str, task: SeedTask | None = None, chip: str = "v5e",
             config: JudgeConfig | None = None) -> EvalResult:
    """Judge one kernel source on ``task`` (default: the flash-attention seed's default task)."""
    config = config or JudgeConfig(chip=chip)
    try:
        judge = Judge(config)
    except ValueError as exc:
        return EvalResult(Status.CRASH, error=str(exc), stage="judge")
    if task is None:
        from seeds import load_seed

        task = load_seed("flash_attention").default_task()
    return judge.evaluate(source, task)
