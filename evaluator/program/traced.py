"""One traced program: the candidate is traced once, and both programs the judge needs come
from that one jaxpr, lowered by a process that never ran candidate code.

The jailed worker (``worker.py``) traces the candidate's entry point exactly once into a closed
jaxpr (``trace``) and ships that jaxpr as data (``wire.py``). The trusted runner rebuilds it and,
from it alone, exports (``jax.export``, ``programs``)

* the **TPU program**: every ``pallas_call`` lowered by Mosaic for the TPU, which the runner
  compiles for the topology (and times);
* the **CPU program**: the same jaxpr with every ``pallas_call`` switched to Pallas' HLO
  interpreter (``interpret=True``: a plain XLA loop over the grid, scratch and outputs filled
  with NaN before first use; its loop as ``interpret.grid_loop`` runs it, operands not copied at
  every step), which the runner executes on the inputs (and checks).

A kernel that behaves differently "on TPU" and "elsewhere", or by how often it was called, has
nothing to branch on: there is one trace, and the process that traced it (and so could be
subverted by the candidate) never lowers or exports anything. What cannot be one program is
refused with a message (``platform_dependent``, host callbacks, effects), by the worker for a
clear early message and again by the runner, which trusts nothing the worker says; the runner
also audits the exported programs (``kernel_audit.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

# Primitives that make a program depend on where or how it runs, or on the host.
_REFUSED = {
    "platform_index": "jax.lax.platform_dependent: the program would branch on the platform, so the "
                      "program checked on the CPU would not be the program timed on the TPU",
    "pure_callback": "a host callback (jax.pure_callback): work done on the host, outside the "
                     "kernel, that no TPU estimate can see",
    "io_callback": "a host callback (io_callback): work done on the host, outside the kernel",
    "debug_callback": "a host callback (jax.debug.callback / jax.debug.print)",
    "callback": "a host callback",
}


class Refused(Exception):
    """The candidate cannot be traced into one program that the judge can both time and check."""


@dataclasses.dataclass(frozen=True)
class Programs:
    """The two exports (``jax.export.Exported``) of one traced program."""

    tpu: object
    cpu: object | None
    primitives: tuple[str, ...]


def _subjaxprs(params: dict) -> Iterator:
    from jax._src import core as jcore

    for value in params.values():
        values = value if isinstance(value, (tuple, list)) else (value,)
        for v in values:
            if isinstance(v, jcore.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jcore.Jaxpr):
                yield v


def primitives(jaxpr) -> set[str]:
    """Every primitive in a jaxpr, kernels and sub-jaxprs included."""
    found: set[str] = set()
    stack = [jaxpr]
    while stack:
        j = stack.pop()
        for eqn in j.eqns:
            found.add(eqn.primitive.name)
            stack.extend(_subjaxprs(eqn.params))
    return found


def check(closed) -> None:
    """Refuse what cannot be one program: platform branches, host callbacks, side effects."""
    names = primitives(closed.jaxpr)
    for name, why in _REFUSED.items():
        if name in names:
            raise Refused(f"refused: {why}")
    # A per-chip program names its mesh axis (a collective's NamedAxisEffect): not a side effect;
    # the runner binds the axis to the task's mesh, and an axis it does not bind fails there.
    effects = [e for e in closed.effects if type(e).__name__ != "NamedAxisEffect"]
    if effects:
        raise Refused(f"refused: the program has side effects ({', '.join(map(str, effects))}); "
                      "a kernel must be a pure function of q, k and v")


def kernel_name(eqn) -> str:
    """A ``pallas_call`` equation's kernel name (the candidate chose it), safe to put in a message."""
    import re

    return re.sub(r"[^\w.\-]", "_", str(eqn.params.get("name") or "pallas_call"))[:60]


def with_interpret(jaxpr, interpret):
    """A copy of ``jaxpr`` whose every ``pallas_call`` (at any depth) has ``interpret`` set and no
    declared cost estimate (``compiler_params.py``: the judge never reads a kernel's account of
    its own cost, so none may reach the compiler either)."""
    from jax._src import core as jcore
    from jax._src.pallas.pallas_call import pallas_call_p

    eqns = []
    for eqn in jaxpr.eqns:
        params = dict(eqn.params)
        if eqn.primitive is pallas_call_p:
            params["interpret"] = interpret
            params["cost_estimate"] = None
        else:
            for key, value in params.items():
                if isinstance(value, jcore.ClosedJaxpr):
                    params[key] = jcore.ClosedJaxpr(with_interpret(value.jaxpr, interpret), value.consts)
                elif isinstance(value, jcore.Jaxpr):
                    params[key] = with_interpret(value, interpret)
        eqns.append(eqn.replace(params=params))
    return jaxpr.replace(eqns=eqns)


def export(closed, interpret: bool, platform: str, args):
    """``jax.export`` of ``closed`` for ``platform``, every pallas_call with ``interpret`` set."""
    import jax
    from jax import export as jexport
    from jax._src import core as jcore

    jaxpr = with_interpret(closed.jaxpr, interpret)
    single = len(jaxpr.outvars) == 1

    def program(*xs):
        outs = jcore.eval_jaxpr(jaxpr, closed.consts, *xs)
        return outs[0] if single else tuple(outs)

    if not interpret:
        return jexport.export(jax.jit(program), platforms=[platform])(*args)
    from evaluator.correctness.interpret import installed

    with installed():     # the grid loop that does not copy the operands at every step
        return jexport.export(jax.jit(program), platforms=[platform])(*args)


def trace(fn, args, axis_env=None):
    """Trace ``fn`` once on ``args`` (ShapeDtypeStructs) into a closed jaxpr; refuse what cannot
    be one program. ``axis_env`` ([(name, size)]) binds a mesh axis for a per-chip program."""
    import jax

    closed = jax.make_jaxpr(fn, axis_env=axis_env)(*args)
    check(closed)
    return closed


def programs(closed, args, *, cpu: bool = True) -> Programs:
    """The TPU program (and the CPU program) of one closed jaxpr: run by the trusted runner."""
    check(closed)
    tpu = export(closed, False, "tpu", args)
    cpu_program = export(closed, True, "cpu", args) if cpu else None
    return Programs(tpu, cpu_program, tuple(sorted(primitives(closed.jaxpr))))
