"""The CPU child of a reference file (seeds/reference.py): the only process that runs the user's
file. ``python -m seeds.reference_child profile FILE OUT SHOWN [SHAPE]`` reads what the task needs
(inputs, output, FLOPs, tolerance, shape grammar) into OUT as JSON, or ``{"error": one line}``;
``... truth FILE DIR SHOWN [SHAPE]`` runs the workload on DIR's inputs, floats in f32, into
DIR/out.npy (or DIR/error.txt); ``... magnitude FILE DIR SHOWN [SHAPE]`` the same on their floats'
absolute values (the size of the terms, ``Task.truth``). A file in KernelBench's convention
(``Model``, ``get_inputs``, ``get_init_inputs``) is read as seeds/kernelbench.py says. Started with
``JAX_PLATFORMS=cpu``: it never holds a TPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from seeds.kernelbench import spread_of_zeros


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


def functions(source: str, shown: str, shape: str = "") -> dict[str, Any]:
    """What a task file holds, in either convention (our ``create_inputs``/``workload``, or
    KernelBench's ``Model``, ``get_inputs``, ``get_init_inputs``: seeds/kernelbench.py):
    ``create`` (no arguments: the example inputs), ``workload``, ``names`` (the inputs' names, or
    None: the workload's), ``grammar`` and ``shape`` (the sizes given and resolved), and for a
    model ``model`` (its init literal, forward's input count, its weights' attributes)."""
    import ast

    from seeds import kernelbench

    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise _Bad(f"is not Python: {exc.msg} (line {exc.lineno})") from None
    if kernelbench.is_task(tree):
        return _model_functions(source, shown, shape, tree)
    try:
        ns = namespace(source, shown)
    except Exception as exc:  # noqa: BLE001 - the user's file, in one line
        raise _Bad(f"fails to import ({_one_line(exc)})") from None
    for name in ("create_inputs", "workload"):
        if not callable(ns.get(name)):
            raise _Bad(f"defines no function {name}(); a reference file defines create_inputs() (example "
                       "arrays) and workload(*inputs) (plain JAX), or KernelBench's Model, get_inputs() "
                       "and get_init_inputs()")
    keywords, grammar = _shape_keywords(ns["create_inputs"], shape)
    return {"create": lambda: ns["create_inputs"](**keywords), "workload": ns["workload"], "names": None,
            "grammar": grammar, "shape": _resolved(ns["create_inputs"], keywords), "model": None, "ns": ns}


def _model_functions(source: str, shown: str, shape: str, tree) -> dict[str, Any]:
    """``functions`` of a task file in KernelBench's convention."""
    import inspect

    from seeds import kernelbench

    defaults = kernelbench.sizes(tree)
    grammar = ",".join(f"{k}={v}" for k, v in defaults.items())
    given: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in shape.split(","))):
        key, _, value = (part.strip() for part in item.partition("="))
        if key not in defaults:
            raise _Bad(f"--shape {shape}: the file sets no module-level integer {key!r}"
                       + (f"; its shape is {grammar}" if grammar else "; it has none"))
        try:
            given[key] = int(value)
        except ValueError:
            raise _Bad(f"--shape {shape}: {key} must be an integer, e.g. {grammar}") from None
        if given[key] < 1:
            raise _Bad(f"--shape {shape}: {key} must be positive")
    try:
        ns = namespace(kernelbench.with_sizes(source, given), shown)
    except Exception as exc:  # noqa: BLE001 - the user's file, in one line
        raise _Bad(f"fails to import ({_one_line(exc)})") from None
    for name in ("get_inputs", "get_init_inputs"):
        if not callable(ns.get(name)):
            raise _Bad(f"defines Model but no function {name}(); KernelBench's convention is Model, "
                       "get_inputs() and get_init_inputs()")
    try:
        init = list(ns["get_init_inputs"]())
        init_text = kernelbench.literal(tuple(init), "get_init_inputs()")
        model = ns["Model"](*init)
    except ValueError as exc:
        raise _Bad(str(exc)) from None
    except Exception as exc:  # noqa: BLE001
        raise _Bad(f"Model(*get_init_inputs()) raises {_one_line(exc)}") from None
    weights = [k for k, v in vars(model).items() if hasattr(v, "shape") and hasattr(v, "dtype")]
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        raise _Bad("Model has no forward(self, ...) method") from None
    inputs = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    taken = set(inputs)
    names = inputs + [w if w not in taken else f"model_{w}" for w in weights]
    count = len(inputs)

    def create():
        example = ns["get_inputs"]()
        example = list(example) if isinstance(example, (tuple, list)) else [example]
        if len(example) != count:
            raise _Bad(f"get_inputs() returns {len(example)} arrays; Model.forward takes {count} "
                       f"({', '.join(inputs)})")
        return (*example, *(getattr(model, w) for w in weights))

    def workload(*args):
        built = ns["Model"](*init)
        for attr, value in zip(weights, args[count:], strict=True):
            setattr(built, attr, value)
        return built.forward(*args[:count])

    resolved = ",".join(f"{k}={given.get(k, v)}" for k, v in defaults.items())
    return {"create": create, "workload": workload, "names": names, "grammar": grammar, "shape": resolved,
            "model": {"init": init_text, "inputs": count, "weights": weights}, "ns": ns}


def workload_of(source: str, shown: str, shape: str = ""):
    """The task file's workload as a function of its inputs (trusted processes only)."""
    return functions(source, shown, shape)["workload"]


def _read_file(source: str, shown: str, shape: str = "") -> dict[str, Any]:
    import inspect

    import jax

    task = functions(source, shown, shape)
    ns = task["ns"]
    try:
        example = task["create"]()
    except _Bad:
        raise
    except Exception as exc:  # noqa: BLE001
        what = "get_inputs()" if task["model"] else "create_inputs()"
        raise _Bad(f"{what} raises {_one_line(exc)}") from None
    if not isinstance(example, (tuple, list)) or not example:
        example = (example,)
    arrays = []
    for i, a in enumerate(example):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise _Bad(f"create_inputs() returned a {type(a).__name__} as input {i}; return arrays only")
        arrays.append(np.asarray(a))
    if task["names"] is not None:
        names = list(task["names"])
    else:
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
        lowered = jax.jit(task["workload"]).lower(*specs)
        out = jax.eval_shape(task["workload"], *specs)
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
        weight = task["model"] is not None and name in names[task["model"]["inputs"]:]
        std = float(values.std())
        if weight and kind == "float" and not values.any():      # a weight left at zeros: a fresh layer's scale
            std = spread_of_zeros(a.shape)
        inputs.append({"name": name, "shape": list(a.shape), "dtype": str(a.dtype), "kind": kind,
                       "static": name in static, "value": a.tolist() if name in static else None,
                       "ragged": ragged.get(name),
                       "mean": float(values.mean()), "std": std, "weight": weight,
                       "min": float(values.min()), "max": float(values.max())})
    found = {"inputs": inputs, "output": {"shape": list(out.shape), "dtype": str(out.dtype)},
             "grammar": task["grammar"], "shape": task["shape"],
            "flops": float(cost.get("flops", 0.0) or 0.0),
             "tolerance": [float(t) for t in tolerance] if tolerance is not None else None}
    if task["model"] is not None:
        found["model"] = task["model"]
    return found


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


def _truth(source_path: str, root: str, shown: str, shape: str = "", absolute: bool = False) -> None:
    import jax
    import jax.numpy as jnp

    from seeds.arrays import load_array, save_array

    root_path = Path(root)
    meta = json.loads((root_path / "inputs.json").read_text())
    units = root_path / "units.json"
    held = json.loads(units.read_text()) if units.is_file() else None

    def in_f32(i: int, a: np.ndarray):
        if not (np.issubdtype(a.dtype, np.floating) or str(a.dtype) == "bfloat16"):
            return a
        if held is not None and not held["inputs"][i]:
            # A model-sized check's weights (no unit axes) go to the device once, in f32, and every
            # unit's call reuses them: a host f32 copy besides, per call, is what outgrew the
            # machine (the MoE's 2.8 GB of bf16 experts are 5.6 GB in f32).
            a = jnp.asarray(a).astype(jnp.float32)
            return jnp.abs(a) if absolute else a
        return np.abs(a.astype(np.float32)) if absolute else a.astype(np.float32)

    inputs = [in_f32(i, load_array(root_path / f"in{i}.npy", m["dtype"])) for i, m in enumerate(meta)]
    try:
        run = jax.jit(workload_of(Path(source_path).read_text(), shown, shape))
        if held is not None:        # a model-sized check: each distinct unit alone (seeds/units.py)
            from seeds.units import group_for, per_base

            group = 1 if held.get("alone") else group_for(run, inputs, held["inputs"])
            out = per_base(lambda *a: np.asarray(run(*map(jnp.asarray, a)), dtype=np.float32), inputs,
                           held["inputs"], held["output"], held["sizes"], group)
        else:
            out = run(*map(jnp.asarray, inputs))
        save_array(root_path / "out.npy", np.asarray(out, dtype=np.float32))
    except Exception as exc:  # noqa: BLE001
        (root_path / "error.txt").write_text(f"workload on a draw raises {_one_line(exc)}")


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    {"profile": _profile, "truth": _truth,
     "magnitude": lambda *args: _truth(*args, absolute=True)}[command](*rest)
