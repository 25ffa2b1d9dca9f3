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


def find(jaxpr: jcore.Jaxpr, want) -> list[tuple[tuple[int, ...], object]]:
    """(path, eqn) of every eqn for which ``want(eqn)``, at any depth, in pre-order. A path is the
    eqn indices from ``jaxpr`` down, a sub-jaxpr numbered in between: a while's condition 0 and
    body 1, a cond's branch k, a scan's or a call's body 0, any other eqn's k-th jaxpr k (the
    paths ``trips.py`` and ``variants.py`` use)."""
    found: list = []

    def walk(j: jcore.Jaxpr, path: tuple[int, ...]) -> None:
        for i, eqn in enumerate(j.eqns):
            here = path + (i,)
            if want(eqn):
                found.append((here, eqn))
            name = eqn.primitive.name
            if name == "while":
                walk(parts(eqn.params["cond_jaxpr"])[0], here + (0,))
                walk(parts(eqn.params["body_jaxpr"])[0], here + (1,))
            elif name == "cond":
                for k, b in enumerate(eqn.params["branches"]):
                    walk(parts(b)[0], here + (k,))
            elif name == "scan" or call_body(eqn) is not None:
                walk(subjaxprs(eqn)[0], here + (0,))
            else:
                for k, sub in enumerate(subjaxprs(eqn)):
                    walk(sub, here + (k,))

    walk(jaxpr, ())
    return found
