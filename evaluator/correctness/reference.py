"""The task's reference: its XLA program's figure (cached on disk) and the ground truth.

Made once per task and judge, before any candidate runs, in trusted processes only: the inputs
(secret draws, ``ground_truth.py``), the f32 truth on them, the task's own XLA program's outputs
on them (the precision baseline) and that program's figure by the judge's own timing source.

A figure from a deterministic timing source (``TimingSource.cacheable``) is kept in
``<cache_dir>/reference_timings.json``, keyed by everything it depends on, and trusted only if the
file is this user's alone and the entry is self-consistent.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from seeds import load_array, save_array
from evaluator.containment.children import Children, private_dir, stage_data, write_inputs
from evaluator.correctness.ground_truth import (Drawn, GroundTruth, draw, timing_distribution, timing_input,
                                                timing_seed, truth_of)
from evaluator.figure.timing import Timing
from evaluator.correctness.verdicts import failure
from evaluator.versions import versions
from seeds import SeedTask

CACHE_FILE = "reference_timings.json"
MAPPED_BYTES = 1 << 30     # an input set past this is kept in files, mapped (References._mapped_set)


@functools.cache
def _code_digest(task_class: type) -> str:
    """A short hash of the source file that defines ``task_class`` (its reference program)."""
    try:
        path = inspect.getsourcefile(task_class)
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else "unknown"
    except (OSError, TypeError):
        return "unknown"


class References:
    """The reference figure and ground truth of every task one judge sees. Thread-safe."""

    def __init__(self, children: Children, label: Callable[[SeedTask], str], cache_dir: str | None) -> None:
        self.children = children
        self.config, self.chip, self.timing = children.config, children.chip, children.timing
        self.label = label
        self.cache_dir = Path(cache_dir or Path.home() / ".cache" / "pallas-evolve")
        self._lock = threading.Lock()
        self._figures: dict[str, Timing] = {}
        self._truth: dict[SeedTask, list[GroundTruth]] = {}
        self._failed: dict[SeedTask, str] = {}          # tasks whose reference program failed
        self._timing_inputs: dict[SeedTask, dict[str, np.ndarray]] = {}
        self._timing_seeds: dict[SeedTask, int] = {}      # secret: the first input set's seed
        self._mapped: Path | None = None                  # model-sized input sets, in files (_mapped_set)

    # ---- what the judge asks --------------------------------------------------------------------
    def truth(self, task: SeedTask) -> list[GroundTruth]:
        """Inputs, the f32 truth, and the task's XLA program's outputs (raises RuntimeError if that
        program fails)."""
        with self._lock:
            if task in self._failed:      # made once: a failure is not retried for every kernel
                raise RuntimeError(self._failed[task])
            if task not in self._truth:
                try:
                    self._truth[task] = self._make(task)
                except RuntimeError as exc:
                    self._failed[task] = str(exc)
                    raise
            return self._truth[task]

    def figure(self, task: SeedTask) -> Timing:
        """The task's plain XLA program, compiled for the same chip, timed by the same source."""
        try:
            self.truth(task)
        except RuntimeError as exc:
            return Timing(None, error=str(exc))
        return self._figures[self.key(task)]

    def adopt(self, task: SeedTask, figure: Timing, truth: Sequence[GroundTruth]) -> None:
        """Take another judge's reference figure and ground truth for ``task`` (same chip, timing
        source and versions): this judge then never times the reference or makes the inputs itself."""
        with self._lock:
            self._truth[task] = list(truth)
            self._figures[self.key(task)] = figure
            # the timing input is the first set's small integers (the other judge's secret draw)
            self._timing_inputs[task] = {
                name: np.asarray(a) for name, a in zip(task.input_names, truth[0].inputs, strict=True)
                if np.issubdtype(np.asarray(a).dtype, np.integer) and np.asarray(a).nbytes <= task.SMALL_INPUT_BYTES}

    def _timing_seed(self, task: SeedTask) -> int:
        """The secret seed of this judge's timing input for ``task`` (drawn once). Under the lock."""
        if task not in self._timing_seeds:
            self._timing_seeds[task] = timing_seed(self.config.correctness_inputs)
        return self._timing_seeds[task]

    def timing_arrays(self, task: SeedTask) -> dict[str, np.ndarray]:
        """The timing input's small integers (``ground_truth.timing_input``, e.g. cache lengths):
        those of the first input set every candidate is checked on, a secret draw."""
        with self._lock:
            if task not in self._timing_inputs:
                self._timing_inputs[task] = timing_input(task, self._timing_seed(task),
                                                         self.config.correctness_inputs)
            return self._timing_inputs[task]

    def timing_inputs(self, task: SeedTask) -> tuple[np.ndarray, ...]:
        """The whole timing input (input set 1), without the f32 truth: the truth's if it is
        made (or adopted), else made again from the timing input's secret seed."""
        with self._lock:
            if task in self._truth:
                return tuple(self._truth[task][0].inputs)
            seed = self._timing_seed(task)
        return tuple(task.make_inputs(seed, timing_distribution(task, self.config.correctness_inputs)))

    def write_timing_input(self, task: SeedTask, directory: Path) -> str:
        """:meth:`timing_arrays` written to ``directory`` (private to the trusted runner), for the
        index maps and the counted loops that read them."""
        arrays = self.timing_arrays(task)
        directory.mkdir()
        for name, array in arrays.items():
            save_array(directory / f"{name}.npy", array)
        return str(directory)

    def key(self, task: SeedTask) -> str:
        """What a stored reference figure depends on: the task, the chip, the timing source, the
        versions, and the task's own code (a changed reference program is timed again)."""
        v = versions()
        return (f"{task.key}|{self.chip.name}|{self.label(task)}|libtpu={v['libtpu_version']}"
                f"|jax={v['jax_version']}|task={_code_digest(type(task))}")

    # ---- making them ------------------------------------------------------------------------------
    def _make(self, task: SeedTask) -> list[GroundTruth]:
        try:
            task.check_units(self._timing_seed(task) + 1)    # a model-sized check's claim, checked first
        except ValueError as exc:
            raise RuntimeError(str(exc)) from None
        sets = [truth_of(task, d) for d in draw(task, self.config.correctness_inputs, self._timing_seed(task),
                                                keep=self._mapped_set)]
        figure = self.cached(task)
        private = private_dir("ref")
        try:
            inputs = write_inputs(private, task.input_names, [g.inputs for g in sets])
            compile_tpu = figure is None or self.children.on_tpu
            outcome = self.children.runner(private, task, "reference", None, inputs, compile_tpu=compile_tpu)
            failed = failure(outcome, self.config.budgets.as_dict(), self.config.budgets.load_s)
            if failed is not None and compile_tpu and failed[1] == "compile" and not self.children.on_tpu:
                # The figure's compile failed (libtpu's static profile of a large XLA program can
                # need more memory than a worker may take: attention at N=4096 needs ~20 GB). The
                # ground truth does not need it: the run goes on with no figure for the reference,
                # saying why, and no speedup over it is claimed.
                figure = Timing(None, error=(f"no figure for the task's XLA reference on {self.chip.name}: "
                                             f"its compile failed ({failed[2]}); speedups over it are "
                                             "not given, kernels are ranked by their own figures"))
                shutil.rmtree(private, ignore_errors=True)
                private = private_dir("ref")
                inputs = write_inputs(private, task.input_names, [g.inputs for g in sets])
                outcome = self.children.runner(private, task, "reference", None, inputs, compile_tpu=False)
                failed = failure(outcome, self.config.budgets.as_dict(), self.config.budgets.load_s)
            if failed is not None:
                raise RuntimeError(f"the task's reference program failed: {failed[2]}")
            data = stage_data(outcome)
            outputs = data["correctness"]["outputs"]
            reduced = tuple(data["correctness"].get("reduced_dots") or ())
            sets = [dataclasses.replace(g, program_out=load_array(str(private / f"out{i}.npy"),
                                                                   outputs[i]["dtype"]),
                                        program_reduced_dots=reduced)
                    for i, g in enumerate(sets)]
            if figure is None:
                figure = self.timing.read(private, data, self.chip)
                if figure.latency_s is not None:
                    self.store(task, figure)
            self._figures[self.key(task)] = figure
        finally:
            shutil.rmtree(private, ignore_errors=True)
        return sets

    def _mapped_set(self, drawn: Drawn) -> Drawn:
        """``drawn``, past ``MAPPED_BYTES`` as read-only maps of files private to this judge: a
        model-sized set (the MoE's 2.8 GB of experts) is not held four times over in the judge's
        memory while its children run (the out-of-memory killer took the judge there)."""
        if sum(np.asarray(a).nbytes for a in drawn.inputs) < MAPPED_BYTES:
            return drawn
        if self._mapped is None:
            self._mapped = private_dir("sets")
            weakref.finalize(self, shutil.rmtree, str(self._mapped), True)
        directory = Path(tempfile.mkdtemp(dir=self._mapped))
        arrays = []
        for i, array in enumerate(drawn.inputs):
            meta = save_array(directory / f"{i}.npy", array)
            arrays.append(load_array(directory / f"{i}.npy", meta["dtype"], mapped=True))
        return drawn._replace(inputs=tuple(arrays))

    # ---- the disk cache ------------------------------------------------------------------------------
    def cached(self, task: SeedTask) -> Timing | None:
        """A stored reference figure, trusted only if the file is ours alone and the entry is sane.
        Only a deterministic source's figures are stored."""
        if not self.timing.cacheable:
            return None
        cache_file = self.cache_dir / CACHE_FILE
        try:
            for path in (cache_file.parent, cache_file):
                st = path.stat()
                if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    print(f"WARNING: ignoring {cache_file}: {path} is not owned by this user alone "
                          "(writable by others); the reference is recompiled", file=sys.stderr)
                    return None
            entry = json.loads(cache_file.read_text()).get(self.key(task))
        except (OSError, ValueError, AttributeError):
            return None
        try:
            cycles, latency = int(entry["cycles"]), float(entry["latency_s"])
        except (TypeError, KeyError, ValueError):
            return None
        if cycles <= 0 or abs(latency - cycles / self.chip.clock_hz) > 1e-9 * latency:
            return None
        return Timing(latency, cycles=cycles)

    def store(self, task: SeedTask, figure: Timing) -> None:
        cache_file = self.cache_dir / CACHE_FILE
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            data = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
            data[self.key(task)] = {"latency_s": figure.latency_s, "cycles": figure.cycles}
            tmp = cache_file.with_name(f"_{cache_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.chmod(tmp, 0o600)
            os.replace(tmp, cache_file)
        except (OSError, ValueError):
            pass   # a cache, nothing more
