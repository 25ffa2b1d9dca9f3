"""The judge's two children: how they are started, with what environment, and in which jail.

1. The **worker** (``worker.py``), the only process that runs candidate code: jailed (``jail.py``:
   own PID, network and mount namespaces, user ``nobody``, only its scratch directory writable),
   it traces the candidate once and ships that jaxpr as data (``wire.py``). It never lowers a
   program and never sees an input.
2. The **runner** (``runner.py``), trusted code only (jailed too off a TPU host), started after the
   worker's namespace is gone, in a private directory: it rebuilds the jaxpr from data, lowers,
   audits, compiles, and runs the interpreter on the inputs.

Each gets a fresh environment built here, never the parent's: the worker no TPU and no libtpu
flags; the runner the chip's topology and what the timing source sets before libtpu loads. Each is
forked from a warm parent that has imported JAX (``zygote.py``) or, failing that, started cold.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import dataclasses
import functools
import math

from evaluator.containment import jail, zygote
from evaluator.containment.sandbox import ChildOutcome, Limits, run_child
from evaluator.containment.worker import PROGRAM_FILE
from evaluator.program import wire
from seeds import SeedTask, save_array, task_source

ROOT = Path(__file__).resolve().parents[2]
# Constructs that cannot be one checked-and-timed program, whatever times it: refused outright.
TRACE_REFUSALS = ("host_callback", "unknown_custom_call", "effects", "multi_platform")
# Which chips of a TPU host a process may use, as a scheduler (Ray) sets them for one task: passed
# on to the runner, so that a judge given one chip times on that chip alone.
# The task's own XLA program (trusted, once per task, its figure cached): budgets this many times a
# candidate's, and at least this much address space (a model-sized program's libtpu compile).
TRUSTED_SCALE = 4
TRUSTED_MEMORY = 22 << 30
CHIP_VISIBILITY_ENV = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")


def on_tpu_host() -> bool:
    """A TPU host has accelerator device nodes; PALLAS_EVOLVE_ON_TPU=0/1 overrides."""
    forced = os.environ.get("PALLAS_EVOLVE_ON_TPU")
    if forced is not None:
        return forced == "1"
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def private_dir(kind: str) -> Path:
    """A directory only this user can reach (mkdtemp makes it 0700), for trusted children."""
    return Path(tempfile.mkdtemp(prefix=f"pallas-evolve-{kind}-"))


def read_regular(path: Path, limit: int) -> bytes | None:
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


def write_inputs(directory: Path, names: Sequence[str], sets: list[tuple]) -> list[str]:
    """Each input set as a directory of ``<name>.npy`` files under ``directory``, for the runner."""
    dirs = []
    for i, arrays in enumerate(sets):
        d = directory / f"inputs{i}"
        d.mkdir()
        for name, array in zip(names, arrays, strict=True):
            save_array(d / f"{name}.npy", array)
        dirs.append(str(d))
    return dirs


def stage_data(outcome: ChildOutcome) -> dict[str, dict]:
    """What a child reported per stage it finished: stage -> its data."""
    return {e["stage"]: e.get("data") or {} for e in outcome.events
            if e.get("event") == "stage_ok" and "stage" in e}


class Children:
    """Starts the worker and the runner for one judge (its configuration, chip and timing source)."""

    def __init__(self, config, chip, timing, on_tpu: bool) -> None:
        self.config, self.chip, self.timing, self.on_tpu = config, chip, timing, on_tpu
        self.isolation = jail.probe()

    # ---- environments ---------------------------------------------------------------------------
    def base_env(self, home: Path) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "TMPDIR": str(home), "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT),
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}

    def worker_env(self, scratch: Path) -> dict[str, str]:
        """The jailed worker only traces and exports: no TPU, no libtpu flags, no timing."""
        return dict(self.base_env(scratch), JAX_PLATFORMS="cpu")

    def runner_env(self, private: Path) -> dict[str, str]:
        env = dict(self.base_env(private), TPU_ACCELERATOR_TYPE=self.chip.accelerator_type,
                   TPU_WORKER_HOSTNAMES="localhost")
        if not self.on_tpu:
            # No chip to guard: let parallel runners load libtpu without its /tmp lockfile.
            env["JAX_PLATFORMS"] = "cpu"
            env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
        else:
            env.update({k: os.environ[k] for k in CHIP_VISIBILITY_ENV if k in os.environ})
        env.update(self.timing.worker_env(private))
        return env

    # ---- starting them ----------------------------------------------------------------------------
    def limits(self, task: SeedTask) -> Limits:
        """The judge's process limits, the file size raised to what ``task``'s arrays need: a child
        writes an input or output whole (as f32 or wider, with its header), so no limit of the
        judge's own stands below the task (a GELU of 8192 x 8192 f32 writes 256 MiB)."""
        shapes = [shape for shape, _ in task.input_specs()] + [tuple(getattr(task, "output_shape", ()) or ())]
        need = 8 * max((math.prod(s) for s in shapes), default=0) + (16 << 20)
        limits = self.config.limits
        return dataclasses.replace(limits, file_bytes=max(limits.file_bytes, need))

    def run(self, module: str, directory: Path, request: dict, env: dict[str, str], *,
            jailed: bool, limits: Limits, total_budget: float | None = None, trusted: bool = False) -> ChildOutcome:
        """``trusted``: the task's own XLA program, compiled and run once per task (its figure is
        cached): it gets TRUSTED_SCALE times the stage budgets and at least TRUSTED_MEMORY of
        address space, since a model-sized XLA program's libtpu compile can need both."""
        (directory / "request.json").write_text(json.dumps(request))
        argv = [sys.executable, "-m", module, str(directory / "request.json")]
        jail_dir = str(directory) if jailed and self.isolation.enabled else None
        if jail_dir:
            argv = self.isolation.wrap(argv, jail_dir)
        budgets = self.config.budgets
        if trusted:
            budgets = dataclasses.replace(budgets, **{f.name: getattr(budgets, f.name) * TRUSTED_SCALE
                                                      for f in dataclasses.fields(budgets)})
            limits = dataclasses.replace(limits, memory_bytes=max(limits.memory_bytes, TRUSTED_MEMORY))
        kwargs = dict(cwd=str(directory), env=env, budgets=budgets.as_dict(), default_budget=budgets.load_s,
                      limits=limits, total_budget=total_budget)
        warm = zygote.for_env(env)      # a warm start (zygote.py); None: a cold one
        if warm is not None:
            try:
                outcome = run_child(argv, **kwargs, launch=functools.partial(
                    warm.launch, {"module": module, "args": [str(directory / "request.json")]}, jail=jail_dir))
                if not outcome.lost:
                    return outcome
            except zygote.ZygoteLost:
                pass
            zygote.drop(warm)      # started again for the next child; this one is run cold
        return run_child(argv, **kwargs)

    def trace(self, source: str, entry: str, task: SeedTask) -> tuple[ChildOutcome, bytes | None]:
        """Run the candidate in the jail, calling its ``entry``; return what it said and the jaxpr
        it traced (as data)."""
        scratch = Path(tempfile.mkdtemp(prefix="pallas-evolve-cand-"))
        try:
            (scratch / "kernel.py").write_text(source)
            if self.isolation.enabled:
                os.chown(scratch, jail.NOBODY, jail.NOBODY)
            request = {"kernel_path": str(scratch / "kernel.py"), "entry": entry,
                       "specs": task.input_specs(), "kwargs": task.kernel_kwargs(), "out_dir": str(scratch)}
            if not self.on_tpu:    # a kernel that asks which chip it runs on is told the judged one
                request["device_kind"] = self.chip.device_kind
            if task.chips > 1:     # a candidate may use the whole mesh (CHIPS = task.chips)
                request["mesh"] = {"axis": task.mesh_axis, "specs": {str(task.chips): task.chip_specs(task.chips)}}
            # The worker only loads and traces: it gets those two budgets, in all.
            budgets = self.config.budgets
            outcome = self.run("evaluator.containment.worker", scratch, request, self.worker_env(scratch),
                               jailed=True, limits=self.limits(task), total_budget=budgets.load_s + budgets.lower_s)
            return outcome, read_regular(scratch / PROGRAM_FILE, wire.MAX_BYTES)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def runner(self, private: Path, task: SeedTask, mode: str, program: str | None, input_dirs: list[str],
               *, compile_tpu: bool = True, prune: dict | None = None, timing_input: str | None = None,
               chips: int = 1, known: list[str] | None = None) -> ChildOutcome:
        """Run the trusted runner in ``private`` on the worker's program (``mode`` "candidate") or
        on the task's own XLA program ("reference"); it stops after lowering a program whose hash
        is ``known`` (evaluator/program/same.py)."""
        request = {"mode": mode, "program": program, "task": task.fields(), "task_source": task_source(task),
                   "specs": task.input_specs(), "input_names": list(task.input_names),
                   "topology": self.chip.topology, "on_tpu": self.on_tpu, "inputs": input_dirs,
                   # a chip of two TensorCores: the check splits "parallel" axes between them
                   "tensorcores": self.chip.tensorcores,
                   # whose values data-dependent index maps are evaluated on (the HBM traffic model)
                   "timing_input": timing_input,
                   "out_dir": str(private), "timing": self.timing.worker_request(),
                   "refuse": list(TRACE_REFUSALS), "compile": compile_tpu, "prune": prune,
                   "constant_budget": self.config.constant_budget_bytes,
                   "chips": chips, "mesh_axis": task.mesh_axis, "known": known or [],
                   "chip_specs": task.chip_specs(chips) if chips > 1 else None}
        # Defence in depth: the runner parses programs a candidate produced. Off a TPU host it is
        # jailed too (it needs no device); its private dir is hidden from workers by their mounts.
        jailed = self.isolation.enabled and not self.on_tpu
        if jailed:
            os.chown(private, jail.NOBODY, jail.NOBODY)
        env = self.runner_env(private)
        if chips > 1 and not self.on_tpu:     # the per-chip program is checked on as many CPU devices
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={chips}"
        elif chips > 1:                       # it runs on the host's chips: not one scheduler's chip
            for key in CHIP_VISIBILITY_ENV:
                env.pop(key, None)
        outcome = self.run("evaluator.runner", private, request, env, jailed=jailed, limits=self.limits(task),
                           trusted=mode == "reference")
        if self.on_tpu and outcome.returncode != 0:
            Path("/tmp/libtpu_lockfile").unlink(missing_ok=True)   # a killed runner's leftover
        return outcome
