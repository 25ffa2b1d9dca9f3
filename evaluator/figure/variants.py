"""Kernel variants: a ``pallas_call``'s kernel traced again with its sites fixed (``trips.py``)
or its DMA starts marked (``dmas.py``).

A *variant* is what the compiler's estimate is read from when a kernel's loops and branches
depend on data: every such loop becomes a loop of a constant number of trips (``fori_loop`` with
a literal bound, which Mosaic lowers to an ``scf.for`` the estimate counts), every such branch one
fixed arm. Everything else is bound exactly as it was. A variant is compiled, never run.
"""

from __future__ import annotations


from jax import lax
from jax._src import core as jcore

from evaluator.figure import dmas
from evaluator.program.jaxpr_tools import bind, call_body, environment, parts


class Uncountable(Exception):
    """The kernel's data-dependent control flow is of a form ``trips.py`` does not count."""


def spec_eval(jaxpr: jcore.Jaxpr, consts, args, choice: dict[tuple, int], path=(), marks=None) -> list:
    """``eval_jaxpr`` with every site fixed: a while at ``choice[path]`` trips, a cond on arm
    ``choice[path]`` (traced into the kernel variant the estimate is read from, never run); and a
    marker after each DMA start at a path in ``marks`` (``dmas.mark``, for the counting run)."""
    marks = marks or {}
    env, read = environment(jaxpr, consts, args)
    prefixes = {p[:j] for p in [*choice, *marks] for j in range(len(p) + 1)}
    for i, eqn in enumerate(jaxpr.eqns):
        here = path + (i,)
        ins = [read(v) for v in eqn.invars]
        if here in marks:
            outs = bind(eqn, ins)
            dmas.mark(marks[here])
        elif here not in prefixes:
            outs = bind(eqn, ins)
        else:
            outs = _spec_eqn(eqn, ins, choice, here, marks)
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _spec_eqn(eqn, ins, choice, here, marks) -> list:
    name = eqn.primitive.name
    if name == "while":
        nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        cond, cconsts = parts(eqn.params["cond_jaxpr"])
        body, bconsts = parts(eqn.params["body_jaxpr"])
        body_args, init = ins[nc:nc + nb], list(ins[nc + nb:])

        def step(carry):
            return spec_eval(body, bconsts, [*body_args, *carry], choice, here + (1,), marks)

        if here in choice:               # a site: k trips, a bound the compiler can see
            trips = int(choice[here])
            if trips == 0:
                return init
            return list(lax.fori_loop(0, trips, lambda _, c: step(list(c)), init))
        return list(lax.while_loop(lambda c: jcore.eval_jaxpr(cond, cconsts, *ins[:nc], *c)[0],
                                   lambda c: step(list(c)), init))
    if name == "cond":
        branches = [parts(b) for b in eqn.params["branches"]]
        if here in choice:
            k = int(choice[here])
            return spec_eval(branches[k][0], branches[k][1], ins[1:], choice, here + (k,), marks)
        arms = [lambda *ops, k=k, b=b: spec_eval(b[0], b[1], list(ops), choice, here + (k,), marks)
                for k, b in enumerate(branches)]
        return list(lax.switch(ins[0], arms, *ins[1:]))
    if name == "scan":
        body, bconsts = parts(eqn.params["jaxpr"])
        nc, ncar = eqn.params["num_consts"], eqn.params["num_carry"]

        def step(carry, x):
            out = spec_eval(body, bconsts, [*ins[:nc], *carry, *x], choice, here + (0,), marks)
            return out[:ncar], out[ncar:]

        carry, ys = lax.scan(step, list(ins[nc:nc + ncar]), list(ins[nc + ncar:]), length=eqn.params["length"],
                             reverse=eqn.params["reverse"])
        return list(carry) + list(ys)
    if (call := call_body(eqn)) is not None:
        sub, consts = call
        return spec_eval(sub, consts, ins, choice, here + (0,), marks)
    raise Uncountable(f"a data-dependent loop, branch or DMA inside {name}")


def retrace(kernel: jcore.Jaxpr, grid_mapping, choice: dict[tuple, int],
            marks: dict[tuple, int] | None = None) -> jcore.Jaxpr:
    """A kernel jaxpr traced again with every site fixed by ``choice`` and a marker after each DMA
    start in ``marks``."""
    from jax._src import api_util
    from jax._src import linear_util as lu
    from jax._src.interpreters import partial_eval as pe

    avals = [v.aval for v in kernel.invars]

    def fixed(*refs):
        return spec_eval(kernel, (), list(refs), choice, (), marks)

    debug = api_util.debug_info("trips", fixed, tuple(avals), {})
    with grid_mapping.trace_env():
        new, _, consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(fixed, debug_info=debug), avals)
    if consts:
        raise Uncountable("a variant of the kernel captured constants")
    return new


def retrace_kernel(eqn, choice: dict[tuple, int]):
    """A copy of a ``pallas_call`` eqn whose kernel has every site fixed by ``choice``."""
    return eqn.replace(params=dict(eqn.params, jaxpr=retrace(eqn.params["jaxpr"], eqn.params["grid_mapping"], choice)))
