"""The CPU child of a reference file (seeds/reference.py): the only process that runs the user's
file. ``python -m seeds.reference_child profile FILE OUT SHOWN [SHAPE]`` reads what the task needs
(inputs, output, FLOPs, tolerance, shape grammar) into OUT as JSON, or ``{"error": one line}``;
``... truth FILE DIR SHOWN`` runs the workload on DIR's inputs, floats in f32, into DIR/out.npy
(or DIR/error.txt); ``... magnitude FILE DIR SHOWN`` the same on their floats' absolute values (the
size of the terms, ``Task.truth``). Started with ``JAX_PLATFORMS=cpu``: it never holds a TPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def namespace(source: str, path: str) -> dict[str, Any]:
    """The reference file executed as a module (trusted processes only: the user's own task)."""
    namespace: dict[str, Any] = {"__name__": "pallas_evolve_reference", "__file__": path}
    exec(compile(source, path, "exec"), namespace)  # noqa: S102 - the user's own trusted reference file
    return namespace


def _profile(source_path: str, out: str, shown: str, shape: str = "") -> None:
    try:
        found = _read_file(Path(source_path).read_text(), shown, shape)
    except _Bad as exc:
        found = {"error": str(exc)}
    Path(out).write_text(json.dumps(found))


class _Bad(Exception):
    pass


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def _shape_keywords(create_inputs, shape: str) -> tuple[dict[str, int], str]:
    """create_inputs' keywords for ``shape`` ("M=8,N=14336"), and its grammar (its integer
    keywords with their defaults)."""
    import inspect

    try:
        params = inspect.signature(create_inputs).parameters.values()
    except (TypeError, ValueError):
        params = []
    defaults = {p.name: p.default for p in params if isinstance(p.default, int) and not isinstance(p.default, bool)}
    grammar = ",".join(f"{k}={v}" for k, v in defaults.items())
    given: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in shape.split(","))):
        key, _, value = item.partition("=")
        if key.strip() not in defaults:
            raise _Bad(f"--shape {shape}: create_inputs takes no {key.strip()!r}"
                       + (f"; its shape is {grammar}" if grammar else "; it takes no shape keywords"))
        try:
            given[key.strip()] = int(value)
        except ValueError:
            raise _Bad(f"--shape {shape}: {key.strip()} must be an integer, e.g. {grammar}") from None
        if given[key.strip()] < 1:
            raise _Bad(f"--shape {shape}: {key.strip()} must be positive")
    return given, grammar


def _resolved(create_inputs, given: dict[str, int]) -> str:
    import inspect

    try:
        params = inspect.signature(create_inputs).parameters.values()
    except (TypeError, ValueError):
        return ""
    values = {p.name: given.get(p.name, p.default) for p in params
              if isinstance(p.default, int) and not isinstance(p.default, bool)}
    return ",".join(f"{k}={v}" for k, v in values.items())


def _read_file(source: str, shown: str, shape: str = "") -> dict[str, Any]:
    import inspect

    import jax

    try:
        ns = namespace(source, shown)
    except Exception as exc:  # noqa: BLE001 - the user's file, in one line
        raise _Bad(f"fails to import ({_one_line(exc)})") from None
    for name in ("create_inputs", "workload"):
        if not callable(ns.get(name)):
            raise _Bad(f"defines no function {name}(); a reference file defines create_inputs() (example "
                       "arrays) and workload(*inputs) (plain JAX)")
    keywords, grammar = _shape_keywords(ns["create_inputs"], shape)
    try:
        example = ns["create_inputs"](**keywords)
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
    ragged = _ragged(ns.get("RAGGED"), names, arrays)
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
    if callable(ns.get("flops")):
        try:
            cost = {"flops": float(ns["flops"](*arrays))}
        except Exception as exc:  # noqa: BLE001
            raise _Bad(f"flops(*create_inputs()) raises {_one_line(exc)}") from None
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
        values = _sample(a).astype(np.float64) if kind == "float" else a.astype(np.float64) if a.size else np.zeros(1)
        inputs.append({"name": name, "shape": list(a.shape), "dtype": str(a.dtype), "kind": kind,
                       "static": name in static, "value": a.tolist() if name in static else None,
                       "ragged": ragged.get(name),
                       "mean": float(values.mean()), "std": float(values.std()),
                       "min": float(values.min()), "max": float(values.max())})
    return {"inputs": inputs, "output": {"shape": list(out.shape), "dtype": str(out.dtype)}, "grammar": grammar,
            "shape": _resolved(ns["create_inputs"], keywords),
            "flops": float(cost.get("flops", 0.0) or 0.0),
            "tolerance": [float(t) for t in tolerance] if tolerance is not None else None}


def _sample(a: np.ndarray, most: int = 1 << 20) -> np.ndarray:
    """A float input's entries for its mean and spread: all of them, or an even stride of about
    ``most`` (a gigabyte of expert weights need not be read whole for two moments)."""
    flat = a.reshape(-1)
    return flat[:: max(1, flat.size // most)] if flat.size else np.zeros(1, a.dtype)


def _ragged(declared: Any, names: list[str], arrays: list[np.ndarray]) -> dict[str, list[int]]:
    """``RAGGED = {"group_sizes": ("lhs", 0)}``: integer inputs whose entries are sizes adding up to
    that dimension of that input (drawn so: a group may be empty); {name: [its total]}."""
    if declared is None:
        return {}
    if not isinstance(declared, dict):
        raise _Bad(f"RAGGED is {declared!r}; give {{'sizes': ('input', dim)}}")
    found = {}
    for name, target in declared.items():
        if name not in names:
            raise _Bad(f"RAGGED names {name!r}, not an input of workload ({', '.join(names)})")
        sizes = arrays[names.index(name)]
        if not (isinstance(target, (tuple, list)) and len(target) == 2 and target[0] in names
                and isinstance(target[1], int) and -arrays[names.index(target[0])].ndim <= target[1]
                < arrays[names.index(target[0])].ndim):
            raise _Bad(f"RAGGED[{name!r}] is {target!r}; give (input, dim), e.g. ('lhs', 0)")
        total = arrays[names.index(target[0])].shape[target[1]]
        if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer) or int(sizes.sum()) != total \
                or int(sizes.min(initial=0)) < 0:
            raise _Bad(f"RAGGED input {name!r} must be 1-D non-negative integers adding up to {target[0]}'s "
                       f"dimension {target[1]} ({total}); create_inputs gives {sizes.tolist()[:8]}")
        found[name] = [int(total)]
    return found


def _truth(source_path: str, root: str, shown: str, absolute: bool = False) -> None:
    import jax
    import jax.numpy as jnp

    from seeds.arrays import load_array, save_array

    root_path = Path(root)
    meta = json.loads((root_path / "inputs.json").read_text())
    inputs = [load_array(root_path / f"in{i}.npy", m["dtype"]) for i, m in enumerate(meta)]
    inputs = [(np.abs(a.astype(np.float32)) if absolute else a.astype(np.float32))
              if np.issubdtype(a.dtype, np.floating) or str(a.dtype) == "bfloat16" else a for a in inputs]
    try:
        out = jax.jit(namespace(Path(source_path).read_text(), shown)["workload"])(*map(jnp.asarray, inputs))
        save_array(root_path / "out.npy", np.asarray(out, dtype=np.float32))
    except Exception as exc:  # noqa: BLE001
        (root_path / "error.txt").write_text(f"workload on a draw raises {_one_line(exc)}")


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    {"profile": _profile, "truth": _truth,
     "magnitude": lambda *args: _truth(*args, absolute=True)}[command](*rest)
