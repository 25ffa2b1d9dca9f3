"""A reference file as a task: ``create_inputs()`` and ``workload(*inputs)`` instead of a task class.

    # R.py: the whole task
    def create_inputs():            # example arrays: the shapes, dtypes and value ranges to judge on
        k1, k2 = jax.random.split(jax.random.key(0))
        return (jax.random.normal(k1, (4096, 4096), jnp.bfloat16),
                jax.random.normal(k2, (4096, 4096), jnp.bfloat16))

    def workload(x, w):             # plain JAX: what the kernel computes, and the XLA program to beat
        return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)

    TOLERANCE = (2e-2, 2e-2)        # optional: (atol, rtol); by default by the output's dtype
    STATIC = ("group_sizes",)       # optional: integer inputs kept as the example has them

From it comes everything a seed's ``Task`` class declares (``--reference R.py`` on every command
that takes a task, beside the kernel: ``evolve eval K.py --reference R.py``):

* secret draws of the example's shapes and dtypes: floats from each input's own mean and spread,
  as ``normal``, with ``outliers`` (a few entries twenty spreads out) and ``scaled`` (the whole
  draw times a factor drawn in [0.1, 10]); integers redrawn uniformly in the example's range,
  booleans at its rate, unless ``STATIC`` names them (indices, lengths);
* the truth: the workload run on the draw with its floats in f32, on the CPU;
* the XLA program speedups are quoted against: the workload itself (and the precision rule: no
  kernel may be less precise than it);
* FLOPs from XLA's own cost analysis of the workload; unavoidable bytes: its inputs and output
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
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from seeds._contract import Seed, SeedError, SeedTask

TOLERANCES = {"bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3), "float32": (2e-4, 2e-4)}
DISTRIBUTIONS = ("normal", "outliers", "scaled")
_CHILD_TIMEOUT_S = 600


class ReferenceError(SeedError):
    """A reference file that cannot be a task; the message is one line."""


def _run_child(*args: str) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-m", "seeds.reference", *args], env=env, capture_output=True,
                          text=True, timeout=_CHILD_TIMEOUT_S)
    if done.returncode:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-1:])[:300]
        raise ReferenceError(f"the reference file's child process failed ({tail})")


@functools.lru_cache(maxsize=16)
def profile_of(source: str, path: str) -> str:
    """What a CPU child reads of a reference file's text (JSON): its inputs, output, FLOPs,
    tolerance; ReferenceError saying what is wrong with the file."""
    with tempfile.TemporaryDirectory(prefix="pallas-evolve-ref-") as tmp:
        (Path(tmp) / "reference.py").write_text(source)
        _run_child("profile", str(Path(tmp) / "reference.py"), str(Path(tmp) / "profile.json"), path)
        found = json.loads((Path(tmp) / "profile.json").read_text())
    if "error" in found:
        raise ReferenceError(f"reference file {path}: {found['error']}")
    return json.dumps(found, sort_keys=True)


def kernel_entry(kernel_source: str, arity: int, given: str | None = None) -> str:
    """The kernel file's entry for a workload of ``arity`` inputs: ``given`` if the file defines
    it, else its one public top-level function that reaches ``pallas_call`` (itself or through the
    file's other functions) and takes ``arity`` positional inputs (ReferenceError when there is
    none or more than one: name it with --entry)."""
    try:
        tree = ast.parse(kernel_source)
    except SyntaxError as exc:
        raise ReferenceError(f"the kernel is not Python (line {exc.lineno})") from None
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name)}
    if given:
        if given not in functions and given not in assigned:
            raise ReferenceError(f"the kernel defines no {given!r} (--entry); name one of its functions: "
                                 f"{', '.join(sorted(functions)) or '(none)'}")
        return given

    def required(fn: ast.FunctionDef) -> int:
        positional = fn.args.posonlyargs + fn.args.args
        return len(positional) - len(fn.args.defaults)

    def names(fn: ast.FunctionDef) -> set[str]:
        return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(fn)
                if isinstance(n, (ast.Attribute, ast.Name))}

    reaches = {name for name, fn in functions.items() if "pallas_call" in names(fn)}
    while True:      # and every function that calls one of those (a wrapper around the wrapper)
        more = {name for name, fn in functions.items() if name not in reaches and names(fn) & reaches}
        if not more:
            break
        reaches |= more
    found = [name for name, fn in functions.items() if not name.startswith("_") and name in reaches
             and required(fn) <= arity <= len(fn.args.posonlyargs + fn.args.args)]
    if len(found) != 1:
        why = "no public function" if not found else f"{len(found)} functions ({', '.join(found)})"
        raise ReferenceError(f"the kernel has {why} that calls pallas_call and takes the workload's {arity} "
                             "inputs; name its entry with --entry NAME")
    return found[0]


@dataclasses.dataclass(frozen=True)
class Task(SeedTask):
    """The task a reference file defines. Its fields (the file's text, where it was read, the
    kernel's entry, what a CPU child read of it) are all a trusted child needs to rebuild it."""

    name = "reference"
    description = "a reference file's workload (create_inputs, workload)"
    shape_grammar = "(the reference file's create_inputs)"
    distributions = DISTRIBUTIONS
    correctness_inputs = (("normal", 0), ("outliers", 1), ("scaled", 2))

    source: str = ""
    path: str = "reference.py"
    entry: str = "workload"
    profile: str = ""

    @classmethod
    def read(cls, path: str | Path, kernel_source: str | None = None, entry: str | None = None) -> Task:
        """The task of the reference file at ``path``, its entry found in ``kernel_source`` (or
        ``entry``); ReferenceError saying what is wrong."""
        path = Path(path).expanduser()
        try:
            source = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReferenceError(f"cannot read the reference file {path}: {exc.__class__.__name__}; give "
                                 "the path of a Python file defining create_inputs() and workload(...)") from None
        try:
            compile(source, str(path), "exec")
        except (SyntaxError, ValueError) as exc:
            raise ReferenceError(f"reference file {path} is not Python (line {getattr(exc, 'lineno', '?')})") from None
        profile = profile_of(source, str(path))
        arity = len(json.loads(profile)["inputs"])
        name = kernel_entry(kernel_source, arity, entry) if kernel_source is not None else (entry or "workload")
        return cls(source=source, path=str(path.resolve()), entry=name, profile=profile)

    @classmethod
    def from_options(cls, shape: str | None = None, **options: Any) -> Task:
        raise ValueError("a reference file's task takes its shapes from create_inputs(); give no --shape")

    # ---- what the CPU child read ---------------------------------------------------------------
    @functools.cached_property
    def _read(self) -> dict[str, Any]:
        return json.loads(self.profile)

    @property
    def input_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(i["name"] for i in self._read["inputs"])

    @property
    def key(self) -> str:
        specs = ".".join(f"{i['dtype']}_{'x'.join(map(str, i['shape'])) or 'scalar'}" for i in self._read["inputs"])
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:8]
        return f"{reference_name(self.path)}/{specs}-{digest}"

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
        rng = np.random.default_rng(seed)
        factor = 10.0 ** rng.uniform(-1.0, 1.0) if distribution == "scaled" else 1.0
        return tuple(_draw(spec, rng, distribution, factor) for spec in self._read["inputs"])

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The workload on ``inputs`` with its floats in f32, run by a CPU child."""
        from evaluator.arrays import load_array, save_array

        with tempfile.TemporaryDirectory(prefix="pallas-evolve-truth-") as tmp:
            root = Path(tmp)
            (root / "reference.py").write_text(self.source)
            meta = [save_array(root / f"in{i}.npy", np.asarray(a)) for i, a in enumerate(inputs)]
            (root / "inputs.json").write_text(json.dumps(meta))
            _run_child("truth", str(root / "reference.py"), str(root), self.path)
            error = root / "error.txt"
            if error.exists():
                raise ReferenceError(f"reference file {self.path}: {error.read_text().strip()}")
            return load_array(root / "out.npy", "float32")

    def reference_program(self):
        return _namespace(self.source, self.path)["workload"]


def _np_dtype(name: str):
    import ml_dtypes

    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def _draw(spec: dict[str, Any], rng: np.random.Generator, distribution: str, factor: float) -> np.ndarray:
    shape, dtype = tuple(spec["shape"]), _np_dtype(spec["dtype"])
    if spec["static"]:
        return np.asarray(spec["value"], dtype=dtype).reshape(shape)
    if spec["kind"] == "bool":
        return rng.random(shape) < spec["mean"]
    if spec["kind"] == "int":
        return rng.integers(int(spec["min"]), int(spec["max"]) + 1, size=shape).astype(dtype)
    spread = spec["std"] or max(abs(spec["mean"]), 1.0)
    values = spec["mean"] + spread * rng.standard_normal(shape)
    if distribution == "outliers" and values.size:
        hit = rng.random(shape) < 1e-3
        values = np.where(hit, spec["mean"] + 20.0 * spread * rng.choice([-1.0, 1.0], size=shape), values)
    return (values * factor).astype(dtype)


def _namespace(source: str, path: str) -> dict[str, Any]:
    """The reference file executed as a module (trusted processes only: the user's own task)."""
    namespace: dict[str, Any] = {"__name__": "pallas_evolve_reference", "__file__": path}
    exec(compile(source, path, "exec"), namespace)  # noqa: S102 - the user's own trusted reference file
    return namespace


class ReferenceSeed(Seed):
    """A reference file in the place of a seed directory: its task is the file's, and it has no
    kernel of its own (the kernel is the command's FILE or ``--start``)."""

    @property
    def kernel_path(self) -> Path:
        raise ReferenceError("a reference file brings no kernel; give the kernel's file (evolve eval K.py, "
                             "--start K.py, or a module with --start)")

    def peer_paths(self, ablation: bool = False) -> dict[str, Path]:
        return {}


def reference_seed(path: str | Path) -> ReferenceSeed:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ReferenceError(f"no reference file at {path}; give the path of a Python file defining "
                             "create_inputs() and workload(...)")
    return ReferenceSeed(reference_name(path), path.resolve().parent, Task)


def reference_name(path: str | Path) -> str:
    """A reference file's name: its stem, or its directory's name for a file called reference.py."""
    path = Path(path)
    return path.resolve().parent.name if path.stem == "reference" else path.stem


# ---- the CPU child ------------------------------------------------------------------------------
def _profile(source_path: str, out: str, shown: str) -> None:
    try:
        found = _read_file(Path(source_path).read_text(), shown)
    except _Bad as exc:
        found = {"error": str(exc)}
    Path(out).write_text(json.dumps(found))


class _Bad(Exception):
    pass


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def _read_file(source: str, shown: str) -> dict[str, Any]:
    import inspect

    import jax

    try:
        ns = _namespace(source, shown)
    except Exception as exc:  # noqa: BLE001 - the user's file, in one line
        raise _Bad(f"fails to import ({_one_line(exc)})") from None
    for name in ("create_inputs", "workload"):
        if not callable(ns.get(name)):
            raise _Bad(f"defines no function {name}(); a reference file defines create_inputs() (example "
                       "arrays) and workload(*inputs) (plain JAX)")
    try:
        example = ns["create_inputs"]()
    except Exception as exc:  # noqa: BLE001
        raise _Bad(f"create_inputs() raises {_one_line(exc)}") from None
    if not isinstance(example, (tuple, list)) or not example:
        example = (example,)
    arrays = []
    for i, a in enumerate(example):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise _Bad(f"create_inputs() returned a {type(a).__name__} as input {i}; return arrays only")
        arrays.append(np.asarray(a))
    try:
        params = list(inspect.signature(ns["workload"]).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][: len(arrays)]
    names += [f"input{i}" for i in range(len(names), len(arrays))]
    static = tuple(ns.get("STATIC", ()) or ())
    for s in static:
        if s not in names:
            raise _Bad(f"STATIC names {s!r}, not an input of workload ({', '.join(names)})")
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    try:
        lowered = jax.jit(ns["workload"]).lower(*specs)
        out = jax.eval_shape(ns["workload"], *specs)
    except Exception as exc:  # noqa: BLE001
        raise _Bad(f"workload(*create_inputs()) raises {_one_line(exc)}") from None
    if not hasattr(out, "shape"):
        raise _Bad(f"workload returns a {type(out).__name__}; it must return one array")
    cost = lowered.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    tolerance = ns.get("TOLERANCE")
    if tolerance is not None and not (isinstance(tolerance, (tuple, list)) and len(tolerance) == 2):
        raise _Bad(f"TOLERANCE is {tolerance!r}; give (atol, rtol)")
    inputs = []
    for name, a in zip(names, arrays):
        kind = "bool" if a.dtype == bool else "int" if np.issubdtype(a.dtype, np.integer) else "float"
        if name in static and kind == "float":
            raise _Bad(f"STATIC names {name!r}, a float input; only integer inputs are static")
        if name in static and a.size > (1 << 16):
            raise _Bad(f"STATIC input {name!r} has {a.size} elements; a static input is small (at most 65536)")
        values = a.astype(np.float64) if a.size else np.zeros(1)
        inputs.append({"name": name, "shape": list(a.shape), "dtype": str(a.dtype), "kind": kind,
                       "static": name in static, "value": a.tolist() if name in static else None,
                       "mean": float(values.mean()), "std": float(values.std()),
                       "min": float(values.min()), "max": float(values.max())})
    return {"inputs": inputs, "output": {"shape": list(out.shape), "dtype": str(out.dtype)},
            "flops": float(cost.get("flops", 0.0) or 0.0),
            "tolerance": [float(t) for t in tolerance] if tolerance is not None else None}


def _truth(source_path: str, root: str, shown: str) -> None:
    import jax
    import jax.numpy as jnp

    from evaluator.arrays import load_array, save_array

    root_path = Path(root)
    meta = json.loads((root_path / "inputs.json").read_text())
    inputs = [load_array(root_path / f"in{i}.npy", m["dtype"]) for i, m in enumerate(meta)]
    inputs = [a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) or str(a.dtype) == "bfloat16" else a
              for a in inputs]
    try:
        out = jax.jit(_namespace(Path(source_path).read_text(), shown)["workload"])(*map(jnp.asarray, inputs))
        save_array(root_path / "out.npy", np.asarray(out, dtype=np.float32))
    except Exception as exc:  # noqa: BLE001
        (root_path / "error.txt").write_text(f"workload on a draw raises {_one_line(exc)}")


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    {"profile": _profile, "truth": _truth}[command](*rest)
