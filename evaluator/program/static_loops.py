"""XLA loops of a fixed trip count around the kernels, unrolled so that the estimate counts every trip.

libtpu's static estimate counts an XLA ``while`` body once, whatever its trip count, so the audit
refuses any loop in the outer program (``xla_loop``, ``kernel_audit.py``). A ``scan`` (what
``lax.fori_loop`` with constant bounds and ``lax.scan`` trace to) has its trip count in the
program itself (``length``): unrolled, it is the same computation as straight-line ops, which the
estimate counts one by one (JAX's ``jnp.searchsorted``, in megablox's group metadata, is such a
loop of two to four trips). The trusted runner unrolls every such scan outside the kernels before
it lowers anything, so the program checked and the program timed are the one unrolled program.
A scan of more than ``MAX_TRIPS`` trips is left as it is (and refused by the audit as before).
"""

from __future__ import annotations

from jax._src import core as jcore

from evaluator.program.jaxpr_tools import call_body

MAX_TRIPS = 64


def unroll_static(closed: jcore.ClosedJaxpr) -> jcore.ClosedJaxpr:
    """``closed`` with every outer ``scan`` of at most MAX_TRIPS trips fully unrolled (also inside
    jit and call bodies; never inside a kernel, a loop or a branch, whose bodies stay as written)."""
    jaxpr = _unrolled(closed.jaxpr)
    return closed if jaxpr is closed.jaxpr else jcore.ClosedJaxpr(jaxpr, closed.consts)


def _unrolled(jaxpr: jcore.Jaxpr) -> jcore.Jaxpr:
    eqns, changed = [], False
    for eqn in jaxpr.eqns:
        new = eqn
        if eqn.primitive.name == "scan" and 1 < eqn.params["length"] <= MAX_TRIPS \
                and eqn.params["unroll"] != eqn.params["length"]:
            new = eqn.replace(params=dict(eqn.params, unroll=eqn.params["length"]))
        elif call_body(eqn) is not None:
            key = "jaxpr" if "jaxpr" in eqn.params else "call_jaxpr"
            body = eqn.params[key]
            inner = body.jaxpr if isinstance(body, jcore.ClosedJaxpr) else body
            fixed = _unrolled(inner)
            if fixed is not inner:
                body = jcore.ClosedJaxpr(fixed, body.consts) if isinstance(body, jcore.ClosedJaxpr) else fixed
                new = eqn.replace(params=dict(eqn.params, **{key: body}))
        changed = changed or new is not eqn
        eqns.append(new)
    return jaxpr.replace(eqns=eqns) if changed else jaxpr
