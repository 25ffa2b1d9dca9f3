"""A reference file as a task: ``create_inputs()`` and ``workload(*inputs)`` instead of a task class.

    # R.py: the whole task
    def create_inputs():            # example arrays: the shapes, dtypes and value ranges to judge on
        k1, k2 = jax.random.split(jax.random.key(0))
        return (jax.random.normal(k1, (4096, 4096), jnp.bfloat16),
                jax.random.normal(k2, (4096, 4096), jnp.bfloat16))

    def workload(x, w):             # plain JAX: what the kernel computes, and the XLA program to beat
        return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)

    TOLERANCE = (2e-2, 2e-2)        # optional: (atol, rtol); by default by the output's dtype
    STATIC = ("lengths",)           # optional: integer inputs kept as the example has them
    RAGGED = {"group_sizes": ("lhs", 0)}   # optional: sizes drawn to add up to lhs's dimension 0
    def flops(*inputs): ...         # optional: the work, where XLA's count is wrong (ragged_dot: all groups)
    SMALL = "M=128,K=256,N=256"     # optional: the shape tests run it at
    CHIP = "v6e"                    # optional: the chip its tasks are judged for by default (v5e)

``create_inputs`` may take integer keywords (``def create_inputs(M=4096, K=4096, N=4096)``): they
are the task's ``--shape`` grammar (``--shape M=8,N=14336``), their defaults its default problem.
A seed directory may hold ``reference.py`` beside its ``kernel.py`` instead of a ``task.py``
(``seeds/matmul``): a built-in task in one short file.

From it comes everything a seed's ``Task`` class declares (``--reference R.py`` on every command
that takes a task, beside the kernel: ``evolve eval K.py --reference R.py``):

* secret draws of the example's shapes and dtypes: floats from each input's own mean and spread,
  as ``normal``, with ``outliers`` (a few entries twenty spreads out) and ``scaled`` (the whole
  draw times a factor drawn in [0.1, 10]); integers redrawn uniformly in the example's range,
  booleans at its rate, unless ``STATIC`` names them (indices, lengths); ``RAGGED`` sizes as a
  random split of their dimension (Dirichlet proportions of a drawn concentration: skewed, some
  groups empty); and ``wide``, the first draw with its floats 100 to 1000 times (docs/judge.md);
* the truth: the workload run on the draw with its floats in f32, on the CPU (on ``wide``, atol
  scaled by the workload on the inputs' absolute values);
* the XLA program speedups are quoted against: the workload itself (and the precision rule: no
  kernel may be less precise than it);
* FLOPs from XLA's own cost analysis of the workload (or the file's ``flops``); unavoidable bytes: its inputs and output
  once each (XLA's byte count is of the unfused program, an overcount for a roofline);
* the kernel's entry (``kernel_entry``): the one public function of the kernel file that calls
  ``pallas_call`` and takes the workload's inputs, else the one ``--entry`` names.

The user's file runs only in child processes on the CPU (``JAX_PLATFORMS=cpu``): the parent never
starts a JAX backend (on a TPU host it would hold the chip the judge's workers time on). A file
that breaks this contract is a ``ReferenceError``, one line saying how to fix it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from seeds._contract import WIDE, Seed, SeedTask, wide_factor, widened
from seeds import units
from seeds.entries import ReferenceError, entry_names, kernel_entry
from seeds import kernelbench
from seeds.reference_child import workload_of

TOLERANCES = {"bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3), "float32": (2e-4, 2e-4)}
DISTRIBUTIONS = ("normal", "outliers", "scaled", "wide")
_CHILD_TIMEOUT_S = 600


def _run_child(*args: str) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-m", "seeds.reference_child", *args], env=env, capture_output=True,
                          text=True, timeout=_CHILD_TIMEOUT_S)
    if done.returncode < 0:        # a signal: its last line of output is not why it stopped
        how = signal.Signals(-done.returncode).name
        hint = ": out of memory? the workload at this shape may need more than this machine has"
        raise ReferenceError(f"the reference file's child process was killed by {how}{hint * (how == 'SIGKILL')}")
    if done.returncode:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-1:])[:300]
        raise ReferenceError(f"the reference file's child process failed ({tail})")


@functools.lru_cache(maxsize=16)
def profile_of(source: str, path: str, shape: str = "") -> str:
    """What a CPU child reads of a reference file's text (JSON) at ``shape`` (create_inputs'
    keywords): its inputs, output, FLOPs, tolerance, shape grammar; ReferenceError saying what
    is wrong with the file."""
    with tempfile.TemporaryDirectory(prefix="pallas-evolve-ref-") as tmp:
        (Path(tmp) / "reference.py").write_text(source)
        _run_child("profile", str(Path(tmp) / "reference.py"), str(Path(tmp) / "profile.json"), path, shape)
        found = json.loads((Path(tmp) / "profile.json").read_text())
    if "error" in found:
        raise ReferenceError(f"reference file {path}: {found['error']}")
    return json.dumps(found, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Task(SeedTask):
    """The task a reference file defines. Its fields (the file's text, where it was read, the
    kernel's entry, what a CPU child read of it) are all a trusted child needs to rebuild it."""

    name = "reference"
    description = "a reference file's workload (create_inputs, workload)"
    distributions = DISTRIBUTIONS
    correctness_inputs = (("normal", 0), ("outliers", 1), ("scaled", 2), WIDE)

    source: str = ""
    path: str = "reference.py"
    entry: str = "workload"
    profile: str = ""
    shape: str = ""               # create_inputs' keywords, as --shape gives them ("" : its defaults)
    names: str = ""               # the kernel entry's names for the inputs ("a,b"; "" : the workload's)
    # A seed's kernel serving this file (evolve/start/serve.py): its entry's k-th argument is the
    # workload's input order[k] ("2,0,1"; "" : the workload's own order)
    order: str = ""
    # A model-sized check (seeds/units.py): where each input and the output hold the units the
    # workload is independent along, their sizes and how many bases a draw copies ("" : none)
    units: str = ""

    @classmethod
    def read(cls, path: str | Path, kernel_source: str | None = None, entry: str | None = None,
             shape: str | None = None, own_kernel: str | None = None, order: str | None = None) -> Task:
        """The task of the reference file at ``path`` at ``shape``, its entry found in
        ``kernel_source`` (or ``entry``), called with the inputs in ``order`` (see the field);
        ReferenceError saying what is wrong."""
        path = Path(path).expanduser()
        try:
            source = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReferenceError(f"cannot read the reference file {path}: {exc.__class__.__name__}; give "
                                 "the path of a Python file defining create_inputs() and workload(...)") from None
        try:
            compile(source, str(path), "exec")
        except (SyntaxError, ValueError) as exc:
            raise ReferenceError(f"reference file {path} is not Python: {getattr(exc, 'msg', exc)} "
                                 f"(line {getattr(exc, 'lineno', '?')})") from None
        profile = profile_of(source, str(path), shape or "")
        arity = len(json.loads(profile)["inputs"])
        model = "model" in json.loads(profile)
        prefer = None
        if own_kernel is not None:       # a seed's own kernel names the entry a start with several uses
            try:
                prefer = kernel_entry(own_kernel, arity)
            except ReferenceError:
                pass
        name = (kernel_entry(kernel_source, arity, entry, prefer, model) if kernel_source is not None
                else (entry or "workload"))
        names = entry_names(kernel_source, name, arity) if kernel_source is not None and "." not in name else ()
        taken = _order(order, arity)
        if taken and names:            # the workload's input order[k] is the entry's k-th name
            names = tuple(names[taken.index(i)] for i in range(arity))
        return cls(source=source, path=str(path.resolve()), entry=name, profile=profile,
                   shape=json.loads(profile)["shape"], names=",".join(names),
                   order=",".join(map(str, taken)), units=units.units_of(path, json.loads(profile)))

    @classmethod
    def from_options(cls, shape: str | None = None, **options: Any) -> Task:
        raise ValueError("a reference file's task takes its shapes from create_inputs(); give no --shape")

    # ---- what the CPU child read ---------------------------------------------------------------
    @functools.cached_property
    def _read(self) -> dict[str, Any]:
        return json.loads(self.profile)

    @property
    def input_names(self) -> tuple[str, ...]:  # type: ignore[override]
        """The kernel's names for its inputs (it is called positionally; the workload may name
        them otherwise), else the workload's."""
        return tuple(self.names.split(",")) if self.names else tuple(i["name"] for i in self._read["inputs"])

    @property
    def key(self) -> str:
        specs = ".".join(f"{i['dtype']}_{'x'.join(map(str, i['shape'])) or 'scalar'}" for i in self._read["inputs"])
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:8]
        served = f"-order{self.order.replace(',', '')}" if self.order else ""
        return f"{reference_name(self.path)}/{specs}-{digest}{served}"

    @property
    def grammar(self) -> str:
        """What --shape accepts: create_inputs' integer keywords and their defaults ("" : none)."""
        return self._read.get("grammar", "")

    @property
    def shape_grammar(self) -> str:  # type: ignore[override]
        return self.grammar


    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [(tuple(i["shape"]), i["dtype"]) for i in self._read["inputs"]]

    @property
    def output_dtype(self) -> str:
        return self._read["output"]["dtype"]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return tuple(self._read["output"]["shape"])

    @property
    def flops(self) -> float:
        return float(self._read["flops"])

    @property
    def bytes_moved(self) -> float:
        arrays = [*self._read["inputs"], self._read["output"]]
        return float(sum(np.prod(a["shape"], dtype=np.int64) * np.dtype(_np_dtype(a["dtype"])).itemsize
                         for a in arrays))

    @property
    def tolerance(self) -> tuple[float, float]:
        given = self._read.get("tolerance")
        return tuple(given) if given else TOLERANCES.get(self.output_dtype, TOLERANCES["float32"])

    # ---- the draws, the truth, the program -------------------------------------------------------
    def make_inputs(self, seed: int, distribution: str = "normal") -> tuple[np.ndarray, ...]:
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {distribution!r}; one of {', '.join(DISTRIBUTIONS)}")
        if distribution == "wide":
            factor = wide_factor(seed)
            return tuple(widened(a, factor) if spec["kind"] == "float" and not spec["static"] else a
                         for a, spec in zip(self.make_inputs(seed, "normal"), self._read["inputs"], strict=True))
        rng = np.random.default_rng(seed)
        factor = 10.0 ** rng.uniform(-1.0, 1.0) if distribution == "scaled" else 1.0
        if not self.units:
            return tuple(_draw(spec, rng, distribution, factor) for spec in self._read["inputs"])
        held = json.loads(self.units)       # copies of a few base units (seeds/units.py)
        assign = units.assignment(rng, math.prod(held["sizes"]), held["bases"])
        bases = [_draw({**spec, "shape": [held["bases"], *np.delete(spec["shape"], ax)]} if ax else spec,
                       rng, distribution, factor)
                 for spec, ax in zip(self._read["inputs"], held["inputs"], strict=True)]
        return tuple(units.expand(bases, held["inputs"], held["sizes"], assign))

    def check_units(self, seed: int) -> None:
        """The file's claim that its workload is independent along its units (seeds/units.py)."""
        if self.units:
            units.check(self, seed)

    def on_units(self, fn, args):
        """``fn`` (the task's XLA program) on ``args``; for a model-sized check, on each distinct
        unit alone (seeds/units.py), as the truth is."""
        if not self.units:
            return fn(*args)
        held = json.loads(self.units)
        arrays = [np.asarray(a) if ax else a for a, ax in zip(args, held["inputs"], strict=True)]   # weights stay put
        return units.per_base(lambda *a: np.asarray(fn(*a)), arrays, held["inputs"], held["output"], held["sizes"],
                              units.group_for(fn, arrays, held["inputs"]))

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The workload on ``inputs`` with its floats in f32, run by a CPU child."""
        return self._workload(inputs, "truth")

    def truth(self, distribution: str, *inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The truth, and on the ``wide`` set the workload on the inputs' absolute values: for a sum
        of products, the size of the terms each element sums, which its rounding follows (a matmul's
        output grows 10^4 to 10^6 times there; docs/judge.md). Elsewhere nothing is scaled."""
        size = self._workload(inputs, "magnitude") if distribution == "wide" else None
        return self.reference(*inputs), size

    def _workload(self, inputs: tuple[np.ndarray, ...], mode: str) -> np.ndarray:
        """The workload on ``inputs`` (on their absolute values for ``mode`` "magnitude"), in f32."""
        from seeds.arrays import load_array, save_array

        with tempfile.TemporaryDirectory(prefix="pallas-evolve-truth-") as tmp:
            root = Path(tmp)
            (root / "reference.py").write_text(self.source)
            meta = [save_array(root / f"in{i}.npy", np.asarray(a)) for i, a in enumerate(inputs)]
            (root / "inputs.json").write_text(json.dumps(meta))
            if self.units:
                (root / "units.json").write_text(self.units)
            _run_child(mode, str(root / "reference.py"), str(root), self.path, self.shape)
            error = root / "error.txt"
            if error.exists():
                raise ReferenceError(f"reference file {self.path}: {error.read_text().strip()}")
            return load_array(root / "out.npy", "float32")

    def reference_program(self):
        return workload_of(self.source, self.path, self.shape)

    def kernel_call(self, source: str) -> tuple[str, str]:
        """A kernel in KernelBench's convention is called through a function appended to it
        (seeds/kernelbench.py); any other as it is, by its entry."""
        model = self._read.get("model")
        if self.order:                 # a seed's kernel serving the file: its inputs in its order
            names = list(self.input_names)
            called = ", ".join(names[int(i)] for i in self.order.split(","))
            return (source + f"\n\n\ndef {SERVED}({', '.join(names)}):\n    return {self.entry}({called})\n",
                    SERVED)
        if model is None or "." not in self.entry:
            return source, self.entry
        sizes = {k: int(v) for k, _, v in (item.partition("=") for item in self.shape.split(",") if item)}
        called = kernelbench.with_sizes(source, sizes)      # its copy of the task's sizes, at this task's
        return called + kernelbench.adapter(self.entry, model, list(self.input_names)), kernelbench.ADAPTER


SERVED = "pallas_evolve_served"     # the function the judge appends to call a seed's kernel in its order


def _order(order: str | None, arity: int) -> tuple[int, ...]:
    """``order`` ("2,0,1") as a tuple, () for none or the identity; ReferenceError if it is no
    order of ``arity`` inputs."""
    if not order:
        return ()
    try:
        taken = tuple(int(i) for i in order.split(","))
    except ValueError:
        taken = ()
    if sorted(taken) != list(range(arity)):
        raise ReferenceError(f"input order {order!r} is not an order of the workload's {arity} inputs "
                             f"(e.g. {','.join(map(str, reversed(range(arity))))})")
    return () if taken == tuple(range(arity)) else taken


def _np_dtype(name: str):
    import ml_dtypes

    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def _draw(spec: dict[str, Any], rng: np.random.Generator, distribution: str, factor: float) -> np.ndarray:
    shape, dtype = tuple(spec["shape"]), _np_dtype(spec["dtype"])
    if spec["static"]:
        return np.asarray(spec["value"], dtype=dtype).reshape(shape)
    if spec["kind"] == "bool":
        return rng.random(shape) < spec["mean"]
    if spec.get("ragged"):
        proportions = rng.dirichlet(np.full(shape, 10.0 ** rng.uniform(-0.7, 0.7)))
        return rng.multinomial(spec["ragged"][0], proportions).astype(dtype)
    if spec["kind"] == "int":
        return rng.integers(int(spec["min"]), int(spec["max"]) + 1, size=shape).astype(dtype)
    spread = spec["std"] or max(abs(spec["mean"]), 1.0)
    if int(np.prod(shape, dtype=np.int64)) > _LARGE:
        return _draw_large(spec["mean"], spread, shape, dtype, rng, distribution, factor)
    values = spec["mean"] + spread * rng.standard_normal(shape)
    if distribution == "outliers" and values.size:
        hit = rng.random(shape) < 1e-3
        values = np.where(hit, spec["mean"] + 20.0 * spread * rng.choice([-1.0, 1.0], size=shape), values)
    return (values * factor).astype(dtype)


_LARGE = 1 << 26      # entries past which an input is drawn in f32, in place (a gigabyte of expert weights)


def _draw_large(mean: float, spread: float, shape: tuple[int, ...], dtype, rng: np.random.Generator,
                distribution: str, factor: float) -> np.ndarray:
    """``_draw``'s floats for an input too large to draw in f64: the same distributions, in f32
    and in place (a few bytes per entry rather than tens)."""
    values = rng.standard_normal(shape, dtype=np.float32)
    values *= np.float32(spread * factor)
    values += np.float32(mean * factor)
    if distribution == "outliers":
        flat = values.reshape(-1)
        hit = rng.integers(0, flat.size, size=max(1, flat.size // 1000))
        flat[hit] = np.float32(factor) * (mean + 20.0 * spread * rng.choice([-1.0, 1.0], size=hit.size))
    return values.astype(dtype)


@dataclasses.dataclass(frozen=True)
class ReferenceSeed(Seed):
    """A reference file as a seed: ``--reference R.py`` (no kernel of its own: the kernel is the
    command's FILE or ``--start``), or a seed directory holding ``reference.py`` and ``kernel.py``."""

    reference: Path = Path("reference.py")

    @property
    def kernel_path(self) -> Path:
        path = self.directory / "kernel.py"
        if self.reference.name != "reference.py" or not path.is_file():
            raise ReferenceError("a reference file brings no kernel; give the kernel's file (evolve eval K.py, "
                                 "--start K.py, or a module with --start)")
        return path

    @property
    def description(self) -> str:
        doc = ast.get_docstring(ast.parse(self.reference.read_text())) or ""
        return doc.strip().splitlines()[0] if doc.strip() else f"the workload of {self.reference}"

    def read_task(self, kernel_source: str | None, entry: str | None = None, shape: str | None = None,
                  order: str | None = None) -> Task:
        own = self.directory / "kernel.py"       # a seed directory's kernel: its entry's name is preferred
        own_source = own.read_text() if self.reference.name == "reference.py" and own.is_file() else None
        return Task.read(self.reference, kernel_source, entry, shape, own_source, order)

    def default_task(self) -> Task:
        return self.read_task(self.kernel_source)

    def task(self, shape: str | None = None, **options: Any) -> Task:
        if options:
            raise ValueError(f"a reference task takes no option {', '.join(sorted(options))}")
        return self.read_task(self.kernel_source, shape=shape)


    def peer_paths(self, ablation: bool = False) -> dict[str, Path]:
        return {}


def reference_seed(path: str | Path) -> ReferenceSeed:
    """The seed of a reference file (``--reference``) or of a directory holding ``reference.py``."""
    path = Path(path).expanduser()
    if path.is_dir() and (path / "reference.py").is_file():
        path = path / "reference.py"
    if not path.is_file():
        raise ReferenceError(f"no reference file at {path}; give the path of a Python file defining "
                             "create_inputs() and workload(...)")
    return ReferenceSeed(reference_name(path), path.resolve().parent, _task_class(path), path.resolve())


_CLASSES: dict[tuple[str | None, str | None, str | None], type[Task]] = {}


def _task_class(path: Path) -> type[Task]:
    """``Task``, or for a file that names the shape its tests run it at (``SMALL = "M=128"``), the
    timing source its task needs (``TIMING = "compiler_estimate_no_vmem_msa"``) or the chip it is
    judged for by default (``CHIP = "v6e"``), all read without running it, a subclass saying so
    (``SeedTask.test_tasks``, ``SeedTask.timing``, ``SeedTask.default_chip``); ``MEMORY = 16``, the
    GiB its judged children get by default (``SeedTask.default_memory_gib``)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return Task

    def constant(name: str, kind: type = str):
        return next((node.value.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                     and isinstance(node.value, ast.Constant) and type(node.value.value) is kind), None)

    key = small, timing, chip, memory = constant("SMALL"), constant("TIMING"), constant("CHIP"), constant("MEMORY", int)
    if key == (None, None, None, None):
        return Task
    if key not in _CLASSES:
        attrs = {"__module__": __name__, "__qualname__": "Task", "timing": timing}
        if small is not None:
            attrs["test_tasks"] = {"small": (small, {})}
        if chip is not None:
            attrs["default_chip"] = chip
        if memory is not None:
            attrs["default_memory_gib"] = memory
        _CLASSES[key] = type("Task", (Task,), attrs)
    return _CLASSES[key]


def reference_name(path: str | Path) -> str:
    """A reference file's name: its stem, or its directory's name for a file called reference.py."""
    path = Path(path)
    return path.resolve().parent.name if path.stem == "reference" else path.stem
