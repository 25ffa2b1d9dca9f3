"""The one artifact a jailed worker hands to the trusted runner: its traced jaxpr, as data.

The worker (which ran candidate code) may not produce the programs the judge times and checks:
whatever it exports, it could export two different ones. So it ships the single closed jaxpr it
traced, and the trusted runner lowers *that* both ways itself (``traced.export``).

The format is a pickle, read by a restricted unpickler that can build nothing but data:

* primitives travel by name (``persistent_id``) and are resolved against the primitives the
  runner's own JAX registers; an unknown name is refused;
* a class is built only if it is on the explicit allow-list below, or is a dataclass, an enum or
  a named tuple defined inside ``jax._src`` (the types jaxpr parameters are made of);
* functions are never resolved (except numpy's and JAX's own reconstructors listed below), so
  no callable a candidate chose can run in the runner;
* source locations (tracebacks) are dropped; they are not part of the program.

Custom-derivative wrappers (``custom_jvp_call``, ``custom_vjp_call``) carry Python callables for
differentiation the judge never does; the worker inlines their primal jaxpr before shipping.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import io
import pickle
import sys

MAX_BYTES = 64 << 20

# (module, name) pairs the runner may build besides jax._src dataclasses, enums and named tuples.
_ALLOWED = {
    ("jax._src.core", name) for name in (
        "ClosedJaxpr", "Jaxpr", "JaxprEqn", "JaxprEqnContext", "Literal", "Var", "DropVar",
        "ShapedArray", "ManualAxisType", "MemorySpace")
} | {
    ("jax._src.state.types", "AbstractRef"), ("jax._src.state.types", "ReadEffect"),
    ("jax._src.state.types", "WriteEffect"), ("jax._src.state.types", "AccumEffect"),
    ("jax._src.state.types", "TransformedRef"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.numeric", "_frombuffer"), ("jax._src.source_info_util", "SourceInfo"),
    ("jax._src.source_info_util", "NameStack"),
    ("jax._src.literals", "TypedFloat"), ("jax._src.literals", "TypedInt"), ("jax._src.frozen_dict", "FrozenDict"),
    ("jax._src.literals", "TypedNdArray"), ("jax._src.named_sharding", "UnspecifiedValue"),
    ("jax._src.named_sharding", "_unpickle_named_sharding"), ("jax._src.mesh", "AbstractMesh"),
    ("jax._src.mesh", "Mesh"), ("jax", "P"), ("jax._src.partition_spec", "PartitionSpec"),
    ("jax._src.tree_util", "default_registry"), ("jaxlib._jax.pytree", "PyTreeDef"),
    ("jaxlib._jax", "PyTreeDef"), ("ml_dtypes", "bfloat16"), ("ml_dtypes", "float8_e4m3fn"),
    ("ml_dtypes", "float8_e5m2"), ("ml_dtypes", "int4"), ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
    ("copyreg", "_reconstructor"), ("builtins", "object"), ("builtins", "frozenset"),
    ("builtins", "set"), ("builtins", "slice"), ("builtins", "complex"),
    # Pallas TPU semaphore types (a kernel that issues its own DMAs waits on them).
    ("jax._src.pallas.mosaic.core", "DMASemaphore"), ("jax._src.tree_util", "tracing_registry"),
}


class WireError(Exception):
    """The artifact is not a jaxpr the runner can rebuild from data alone."""


# ---- the worker's side --------------------------------------------------------------------------
def _inline_custom(jaxpr):
    """A copy of ``jaxpr`` with custom_jvp/vjp wrappers replaced by calls of their primal jaxpr."""
    from jax._src import core as jcore

    def fix(value):
        if isinstance(value, jcore.ClosedJaxpr):
            return jcore.ClosedJaxpr(_inline_custom(value.jaxpr), value.consts)
        if isinstance(value, jcore.Jaxpr):
            return _inline_custom(value)
        if isinstance(value, tuple) and any(isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)) for v in value):
            return tuple(fix(v) for v in value)
        return value

    eqns = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("custom_jvp_call", "custom_vjp_call"):
            body = eqn.params["call_jaxpr"]
            eqn = eqn.replace(primitive=jcore.closed_call_p, params={"call_jaxpr": fix(body)})
        else:
            eqn = eqn.replace(params={k: fix(v) for k, v in eqn.params.items()})
        eqns.append(eqn)
    return jaxpr.replace(eqns=eqns)


def _is_dynamic_grid_dim(obj) -> bool:
    """Pallas' marker of a grid dimension whose size is an operand (``DynamicGridDim``): it travels
    by name, so that the runner's lowering finds its own singleton (it tests ``is``)."""
    from jax._src.pallas import core as pallas_core

    return isinstance(obj, pallas_core.DynamicGridDim)


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        from jax._src import core as jcore

        if isinstance(obj, jcore.Primitive):
            return ("primitive", obj.name)
        if _is_dynamic_grid_dim(obj):
            return ("dynamic_grid_dim",)
        return None

    def reducer_override(self, obj):
        import numpy as np
        from jax._src import core as jcore
        from jax._src import source_info_util as siu

        from jax._src import literals

        if isinstance(obj, literals.TypedNdArray):   # its own __reduce__ passes weak_type as aval
            return (literals.TypedNdArray, (np.asarray(obj), obj.aval))
        if isinstance(obj, siu.SourceInfo):
            return (siu.SourceInfo, (None, siu.NameStack()))
        if isinstance(obj, jcore.DebugInfo):
            paths = obj.result_paths
            paths = tuple(paths()) if callable(paths) else (paths if isinstance(paths, tuple) else None)
            return (jcore.DebugInfo, (str(obj.traced_for), str(obj.func_src_info), obj.arg_names, paths))
        return NotImplemented


def dumps(closed) -> bytes:
    """The worker's artifact: ``closed`` (a ClosedJaxpr) as data. Raises WireError if it holds
    anything but data (a Python callable the program would need at run time)."""
    from jax._src import core as jcore

    closed = jcore.ClosedJaxpr(_inline_custom(closed.jaxpr), closed.consts)
    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(closed)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise WireError(f"the traced program holds something that is not data ({exc}); "
                        "a kernel must trace to primitives and arrays only") from exc
    return buf.getvalue()


# ---- the runner's side --------------------------------------------------------------------------
@functools.cache
def _primitives() -> dict:
    """Every primitive the runner's own JAX (with Pallas and its TPU backend) registers, by name."""
    import jax  # noqa: F401
    import jax.experimental.pallas  # noqa: F401
    import jax.experimental.pallas.tpu  # noqa: F401
    from jax._src import core as jcore

    found: dict[str, object] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "jax" or name.startswith(("jax.", "jaxlib."))):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, jcore.Primitive):
                found.setdefault(value.name, value)
    return found


def _is_data_type(cls) -> bool:
    if not isinstance(cls, type):
        return False
    if dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum):
        return True
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        allowed = (module, name) in _ALLOWED
        if not allowed and module.startswith("jax._src.") and "." not in name:
            mod = sys.modules.get(module)
            allowed = mod is not None and _is_data_type(getattr(mod, name, None))
        if not allowed:
            raise WireError(f"refused: the program asks the runner to build {module}.{name}, "
                            "which is not plain jaxpr data")
        return super().find_class(module, name)

    def persistent_load(self, pid):
        if pid == ("dynamic_grid_dim",):
            from jax._src.pallas import core as pallas_core

            return pallas_core.dynamic_grid_dim
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "primitive"):
            raise WireError(f"refused: unknown reference {pid!r} in the program")
        primitive = _primitives().get(pid[1])
        if primitive is None:
            raise WireError(f"refused: the program uses primitive {pid[1]!r}, unknown to this JAX")
        return primitive


def loads(blob: bytes):
    """Rebuild the worker's ClosedJaxpr from data, or raise WireError."""
    from jax._src import core as jcore

    if len(blob) > MAX_BYTES:
        raise WireError(f"refused: the program is {len(blob)} bytes, over {MAX_BYTES}")
    _primitives()   # import everything the allow-list checks against
    try:
        closed = _Unpickler(io.BytesIO(blob)).load()
    except WireError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed artifact is a refusal, not a crash
        raise WireError(f"refused: the program could not be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(closed, jcore.ClosedJaxpr):
        raise WireError(f"refused: the artifact is a {type(closed).__name__}, not a ClosedJaxpr")
    return closed
