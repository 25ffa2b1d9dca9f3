"""Multi-chip candidates: the judge's own harness around a per-chip program (trusted side).

A task with ``chips > 1`` offers a mesh (a v5e 2x2 for ``--chips 4``). A candidate that sets
``CHIPS = <chips>`` hands the jailed worker a *per-chip* program: it takes one chip's share of each
input (the task's ``chip_specs``) and uses JAX collectives over the task's ``mesh_axis``. The worker
traces it once with that axis bound (``make_jaxpr(axis_env=...)``) and ships the jaxpr as usual.
Nothing about the mesh is the candidate's to choose: this module, in the trusted runner, builds

* ``mesh_program``: ``jit(shard_map(per-chip jaxpr))`` over the mesh's devices, every input given
  as ``(chips, *chip_spec)`` (chip c's share at ``[c]``, from the task's ``chip_split``) and sharded
  on its leading axis, every chip's output kept (``(chips, *out)``), so the judge can check that
  *every* chip holds the right answer. Compiled for the topology it is the program the estimate and
  the ICI model read; with ``interpret`` on 4 CPU devices it is the program that is checked.
* ``chip_program``: chip c's program alone, for one device, with each collective replaced by a
  local stand-in of the same shape (``axis_index`` is c). Its numbers are meaningless; it exists
  so that the audit and the HBM traffic model, which read one chip's exported kernels, see
  exactly the kernels chip c runs, on chip c's own inputs.
"""

from __future__ import annotations

from collections.abc import Callable

# The collectives a per-chip program may use, and their local stand-ins (shape-preserving).
COLLECTIVES = ("psum", "pmax", "pmin", "all_gather", "axis_index", "ppermute")
_CALLS = ("pjit", "jit", "closed_call", "core_call")


class MeshRefused(Exception):
    """A per-chip program the harness cannot run (one line)."""


def _remote_target(eqn) -> bool | None:
    """Whether a DMA or a semaphore signal names another chip (a device id); None: not one of them."""
    name = eqn.primitive.name
    try:
        if name == "dma_start":
            return eqn.params["tree"].unflatten(eqn.invars)[4] is not None
        if name == "semaphore_signal":
            return eqn.params["args_tree"].unflatten(eqn.invars)[3] is not None
    except Exception:  # noqa: BLE001 - unreadable: assume it does
        return True
    return None


def remote_communication(jaxpr) -> list[str]:
    """What in ``jaxpr`` (kernels included) talks to another chip from inside a kernel: a DMA or a
    semaphore signal with a device id, a barrier semaphore. The ICI model costs the program's XLA
    collectives only; a kernel's own traffic between chips would be free, so it is refused."""
    from evaluator.program.traced import _subjaxprs

    found, stack = [], [jaxpr]
    while stack:
        j = stack.pop()
        for eqn in j.eqns:
            if _remote_target(eqn) or eqn.primitive.name == "get_barrier_semaphore":
                found.append(eqn.primitive.name)
            stack.extend(_subjaxprs(eqn.params))
    return sorted(set(found))


def _stand_in(eqn, invals: list, chip: int):
    import jax.numpy as jnp

    name = eqn.primitive.name
    if name == "axis_index":
        return jnp.int32(chip)
    if name in ("psum", "pmax", "pmin", "ppermute"):
        return invals if eqn.primitive.multiple_results else invals[0]
    if name == "all_gather":
        (x,), out = invals, eqn.outvars[0].aval
        dim = eqn.params["all_gather_dimension"]
        if eqn.params.get("tiled"):
            return jnp.concatenate([x] * (out.shape[dim] // x.shape[dim]), axis=dim)
        return jnp.broadcast_to(jnp.expand_dims(x, dim), out.shape)
    raise MeshRefused(f"refused: collective {name!r} has no local stand-in; use {', '.join(COLLECTIVES)}")


def _eval_local(jaxpr, consts, args, chip: int):
    """``jaxpr`` evaluated (under a trace) with its collectives replaced by stand-ins."""
    from jax._src import core as jcore

    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name in COLLECTIVES or name.startswith(("psum", "all_to_all", "reduce_scatter", "pbroadcast")):
            outs = _stand_in(eqn, invals, chip)
        elif name in _CALLS:
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            sub = sub if isinstance(sub, jcore.ClosedJaxpr) else jcore.ClosedJaxpr(sub, ())
            outs = _eval_local(sub.jaxpr, sub.consts, invals, chip)
        else:
            outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
        if not eqn.primitive.multiple_results and name not in _CALLS:
            outs = [outs]
        for var, value in zip(eqn.outvars, outs, strict=True):
            if not isinstance(var, jcore.DropVar):
                env[var] = value
    return [read(v) for v in jaxpr.outvars]


def chip_function(closed, chip: int) -> Callable:
    """Chip ``chip``'s program alone (collectives as local stand-ins), a function of its inputs."""
    single = len(closed.jaxpr.outvars) == 1

    def program(*xs):
        outs = _eval_local(closed.jaxpr, closed.consts, xs, chip)
        return outs[0] if single else tuple(outs)

    return program


def chip_export(closed, chip: int, interpret: bool, platform: str, args):
    """``jax.export`` of chip ``chip``'s program alone (for the audit and the HBM traffic model)."""
    import jax
    from jax import export as jexport
    from jax._src import core as jcore

    from evaluator.program.traced import with_interpret

    fixed = jcore.ClosedJaxpr(with_interpret(closed.jaxpr, interpret), closed.consts)
    return jexport.export(jax.jit(chip_function(fixed, chip)), platforms=[platform])(*args)


def mesh_program(closed, devices, axis: str, *, interpret: bool) -> Callable:
    """``jit(shard_map)`` of the per-chip jaxpr over ``devices``: inputs ``(chips, *chip_spec)``
    sharded on their leading axis, outputs ``(chips, *out)`` (each chip's own)."""
    import jax
    import numpy as np
    from jax._src import core as jcore
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from evaluator.program.traced import with_interpret

    jaxpr = with_interpret(closed.jaxpr, interpret)
    mesh = Mesh(np.array(devices), (axis,))
    n_out = len(jaxpr.outvars)

    def body(*xs):
        outs = jcore.eval_jaxpr(jaxpr, closed.consts, *[x[0] for x in xs])
        outs = [o[None] for o in outs]
        return outs[0] if n_out == 1 else tuple(outs)

    out_specs = P(axis) if n_out == 1 else (P(axis),) * n_out
    program = jax.shard_map(body, mesh=mesh, in_specs=(P(axis),) * len(jaxpr.invars), out_specs=out_specs,
                            check_vma=False)
    return jax.jit(program)


def sharded_specs(chip_specs, devices, axis: str) -> list:
    """The mesh program's arguments as ShapeDtypeStructs: ``(chips, *chip_spec)`` sharded on axis 0."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(Mesh(np.array(devices), (axis,)), P(axis))
    return [jax.ShapeDtypeStruct((len(devices), *shape), dtype, sharding=sharding) for shape, dtype in chip_specs]


def put_sharded(arrays, devices, axis: str) -> list:
    """Stacked per-chip arrays ``(chips, ...)`` placed one share per device."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(Mesh(np.array(devices), (axis,)), P(axis))
    return [jax.device_put(a, sharding) for a in arrays]
