"""Small helpers for walking and re-binding jaxprs (the trusted runner's own evaluators:
``trips.py``, ``variants.py``, ``dmas.py``)."""

from __future__ import annotations

from jax._src import core as jcore

# Call-like primitives whose body is evaluated inline (jit, custom derivatives).
CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")


def parts(value) -> tuple[jcore.Jaxpr, tuple]:
    """(jaxpr, consts) of a Jaxpr or ClosedJaxpr."""
    if isinstance(value, jcore.ClosedJaxpr):
        return value.jaxpr, tuple(value.consts)
    return value, ()


def call_body(eqn) -> tuple[jcore.Jaxpr, tuple] | None:
    """(jaxpr, consts) of a call-like eqn's body, or None for any other eqn."""
    if eqn.primitive.name not in CALLS:
        return None
    for key in ("jaxpr", "call_jaxpr"):
        if key in eqn.params:
            return parts(eqn.params[key])
    return None


def environment(jaxpr: jcore.Jaxpr, consts, args):
    """(env, read) for evaluating ``jaxpr`` by hand: its constants and inputs bound in ``env``,
    ``read(var)`` a literal's value or the variable's."""
    env: dict = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    return env, read


def bind(eqn, ins) -> list:
    """``eqn`` applied to ``ins`` as ``eval_jaxpr`` does; a list of outputs."""
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*ins, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def subjaxprs(eqn) -> list[jcore.Jaxpr]:
    """Every jaxpr in an eqn's parameters, in order."""
    out = []
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, (jcore.ClosedJaxpr, jcore.Jaxpr)):
                out.append(parts(v)[0])
    return out
