"""Which loops and branches of a kernel the figure must count (*sites*), and counting them as
the interpreted kernel runs (``trips.py`` makes the figure from the counts).

A site is a ``while`` whose condition, or a ``cond`` whose index, depends on what the kernel reads
from memory (any operand: scalar prefetch, blocks, scratch), or on the carry of a site loop: in a
variant (``variants.py``) that loop runs made-up trips, so an inner loop bounded by its induction
variable would be simulated on them. A loop or branch on ``program_id`` or constants is not one:
the estimate simulates it. :func:`sites` finds them by the same walk on the kernel's own jaxpr
(refs) and on the discharged one the interpreter runs (values), so both agree on their order.

:func:`count_eval` is ``eval_jaxpr`` that also sums, per site, its entries, each ``while``'s trips
and their squares per entry, or each ``cond``'s arms taken, and one count per DMA marker
(``dmas.py``); the interpreter calls it through :class:`Counter` once per grid step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax._src import core as jcore

from evaluator.figure import dmas
from evaluator.figure.variants import Uncountable
from evaluator.program.jaxpr_tools import bind, call_body, environment, find, parts, subjaxprs

@dataclasses.dataclass(frozen=True)
class Site:
    path: tuple[int, ...]      # eqn indices from the kernel jaxpr down to the eqn (sub-jaxprs numbered too)
    kind: str                  # "while" or "cond"
    arms: int = 0              # a cond's branches
    dma: bool = False          # a cond with an arm that starts a DMA it does not wait for, or the reverse

    @property
    def width(self) -> int:
        """Counters it needs: a while's entries, trips and squared trips per entry, or a cond's
        count per arm."""
        return 3 if self.kind == "while" else self.arms

    def named(self, kernel: int) -> str:
        what = "loop" if self.kind == "while" else "branch"
        return f"the {what} at path {list(self.path)} (kernel {kernel})"


# ---- 1. sites ---------------------------------------------------------------------------------
def _walk(jaxpr: jcore.Jaxpr, taint_in: list[bool], found: list[Site] | None, path: tuple[int, ...]) -> list[bool]:
    """Which outputs of ``jaxpr`` depend on data, given which inputs do; appends the sites met (in
    pre-order) to ``found`` when it is not None."""
    tainted: dict[Any, bool] = {v: t for v, t in zip(jaxpr.invars, taint_in, strict=True)}
    for v in jaxpr.constvars:
        tainted[v] = False

    def t(v) -> bool:
        return False if isinstance(v, jcore.Literal) else tainted.get(v, True)

    for i, eqn in enumerate(jaxpr.eqns):
        here = path + (i,)
        ins = [t(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name == "while":
            nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
            cond, _ = parts(eqn.params["cond_jaxpr"])
            body, _ = parts(eqn.params["body_jaxpr"])
            carry = ins[nc + nb:]
            while True:
                out = _walk(body, ins[nc:nc + nb] + carry, None, here)
                new = [a or b for a, b in zip(carry, out, strict=True)]
                if new == carry:
                    break
                carry = new
            if _walk(cond, ins[:nc] + carry, None, here)[0]:
                # A counted loop runs a made-up number of trips in every variant: whatever its
                # carry feeds (an inner loop bounded by its induction variable, a branch on it) is
                # counted too, or the estimate would simulate it on the variant's trips.
                carry = [True] * len(carry)
                if found is not None:
                    found.append(Site(here, "while"))
            if found is not None:
                _walk(cond, ins[:nc] + carry, found, here + (0,))
                _walk(body, ins[nc:nc + nb] + carry, found, here + (1,))
            outs = carry
        elif name == "cond":
            branches = [parts(b)[0] for b in eqn.params["branches"]]
            if found is not None and ins[0]:
                found.append(Site(here, "cond", len(branches), any(_unbalanced_dma(b) for b in branches)))
            outs = [ins[0]] * len(eqn.outvars)
            for k, b in enumerate(branches):
                res = _walk(b, ins[1:], found, here + (k,))
                outs = [a or r for a, r in zip(outs, res, strict=True)]
        elif name == "scan":
            body, _ = parts(eqn.params["jaxpr"])
            nc, ncar = eqn.params["num_consts"], eqn.params["num_carry"]
            carry, xs = ins[nc:nc + ncar], ins[nc + ncar:]
            while True:
                out = _walk(body, ins[:nc] + carry + xs, None, here)
                new = [a or b for a, b in zip(carry, out[:ncar], strict=True)]
                if new == carry:
                    break
                carry = new
            outs = _walk(body, ins[:nc] + carry + xs, found, here + (0,))
            outs = carry + outs[ncar:]
        elif (call := call_body(eqn)) is not None:
            sub = call[0]
            outs = _walk(sub, ins, found, here + (0,)) if len(sub.invars) == len(ins) else \
                [True] * len(eqn.outvars)
        else:
            for k, sub in enumerate(subjaxprs(eqn)):      # e.g. run_scoped: its refs are data
                _walk(sub, [True] * len(sub.invars), found, here + (k,))
            outs = [any(ins) or bool(subjaxprs(eqn))] * len(eqn.outvars)
        for v, o in zip(eqn.outvars, outs, strict=True):
            tainted[v] = o
    return [t(v) for v in jaxpr.outvars]


def _unbalanced_dma(jaxpr: jcore.Jaxpr) -> bool:
    """An arm that starts DMAs it does not wait for (a prefetch), or waits for ones it did not start."""
    ops = [eqn.primitive.name for _, eqn in find(jaxpr, lambda e: e.primitive.name in ("dma_start", "dma_wait"))]
    return ops.count("dma_start") != ops.count("dma_wait")


def sites(jaxpr: jcore.Jaxpr) -> list[Site]:
    """The data-dependent loops and branches of a kernel jaxpr (every operand is data)."""
    found: list[Site] = []
    _walk(jaxpr, [True] * len(jaxpr.invars), found, ())
    return found


def same_sites(a: list[Site], b: list[Site]) -> bool:
    """The kernel's and the discharged kernel's sites agree, kind for kind, in order."""
    return [(s.kind, s.arms) for s in a] == [(s.kind, s.arms) for s in b]


# ---- 2. counting ------------------------------------------------------------------------------
class Counter:
    """Where each site's counters sit in one kernel's count vector, then one per DMA marker
    (``dmas.py``; ``marks``: (path, slot) in the discharged kernel)."""

    def __init__(self, found: list[Site], marks: list[tuple[tuple, int]] = ()) -> None:
        self.index, self.offset, n = {}, {}, 0
        for k, s in enumerate(found):
            self.index[s.path], self.offset[s.path] = k, n
            n += s.width
        self.sites_size = n
        for path, slot in marks:
            self.offset[path] = n + slot
        self.size = n + len(marks)
        paths = [s.path for s in found] + [p for p, _ in marks]
        self.prefixes = {p[:j] for p in paths for j in range(len(p) + 1)}

    def zeros(self):
        return jnp.zeros((self.size,), jnp.int32)

    def eval(self, kernel, consts, args) -> tuple[list, Any]:
        """One grid step of ``kernel``, with its counts (the interpreter's hook)."""
        return count_eval(kernel, consts, args, self)

    def bump(self, counts, path, slot: int, by=1):
        return counts.at[self.offset[path] + slot].add(jnp.asarray(by, jnp.int32))

    def holds(self, path) -> bool:
        """Whether a site sits at or below ``path``."""
        return path in self.prefixes


def count_eval(jaxpr: jcore.Jaxpr, consts, args, counter: Counter, path=()) -> tuple[list, Any]:
    """``eval_jaxpr`` that also returns the counts of the sites it passes (a vector per kernel)."""
    env, read = environment(jaxpr, consts, args)
    counts = counter.zeros()
    for i, eqn in enumerate(jaxpr.eqns):
        here = path + (i,)
        ins = [read(v) for v in eqn.invars]
        if eqn.primitive is dmas.MARK:
            outs = ins
            counts = counter.bump(counts, here, 0)
        elif not counter.holds(here):
            outs = bind(eqn, ins)
        else:
            outs, delta = _count_eqn(eqn, ins, counter, here)
            counts = counts + delta
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars], counts


def _count_eqn(eqn, ins, counter: Counter, here) -> tuple[list, Any]:
    name = eqn.primitive.name
    site = here in counter.index
    if name == "while":
        nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        cond, cconsts = parts(eqn.params["cond_jaxpr"])
        body, bconsts = parts(eqn.params["body_jaxpr"])
        if counter.holds(here + (0,)):
            raise Uncountable("a data-dependent loop or branch inside a while loop's condition")
        cond_args, body_args = ins[:nc], ins[nc:nc + nb]

        def cond_f(state):
            return jcore.eval_jaxpr(cond, cconsts, *cond_args, *state[0])[0]

        def body_f(state):
            carry, counts, k = state
            out, delta = count_eval(body, bconsts, [*body_args, *carry], counter, here + (1,))
            counts = counts + delta
            return out, counter.bump(counts, here, 1) if site else counts, k + 1

        start = counter.bump(counter.zeros(), here, 0) if site else counter.zeros()
        carry, counts, k = lax.while_loop(lambda st: cond_f(st[:2]), body_f,
                                          (list(ins[nc + nb:]), start, jnp.int32(0)))
        return list(carry), counter.bump(counts, here, 2, k * k) if site else counts
    if name == "cond":
        branches = [parts(b) for b in eqn.params["branches"]]

        def arm(k, b):
            def f(*ops):
                out, delta = count_eval(b[0], b[1], list(ops), counter, here + (k,))
                return out, counter.bump(delta, here, k) if site else delta
            return f

        outs, counts = lax.switch(ins[0], [arm(k, b) for k, b in enumerate(branches)], *ins[1:])
        return list(outs), counts
    if name == "scan":
        body, bconsts = parts(eqn.params["jaxpr"])
        nc, ncar = eqn.params["num_consts"], eqn.params["num_carry"]

        def step(state, x):
            carry, counts = state
            out, delta = count_eval(body, bconsts, [*ins[:nc], *carry, *x], counter, here + (0,))
            return (out[:ncar], counts + delta), out[ncar:]

        (carry, counts), ys = lax.scan(step, (list(ins[nc:nc + ncar]), counter.zeros()), list(ins[nc + ncar:]),
                                       length=eqn.params["length"], reverse=eqn.params["reverse"])
        return list(carry) + list(ys), counts
    if (call := call_body(eqn)) is not None:
        sub, consts = call
        return count_eval(sub, consts, ins, counter, here + (0,))
    raise Uncountable(f"a data-dependent loop or branch inside {name}")
