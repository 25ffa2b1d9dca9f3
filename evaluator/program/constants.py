"""What a candidate's program holds as data instead of computing it: the constant budget.

A kernel that knows the inputs it is checked on can carry their answers in its program: arrays
made at trace time (the exact outputs, computed with numpy) enter the jaxpr as constants, and a
trivial kernel picks one. The judge's inputs are secret (``judge.py`` draws them), so such a
kernel fails correctness; this module is the second wall, run by the trusted runner on the jaxpr
it rebuilt (never on anything the worker says):

* **data**: every constant the program carries, at any depth: the closed jaxpr's consts, the
  literals of every equation, the consts of every nested jaxpr (kernel bodies, index maps,
  branches) and any array in an equation's parameters;
* **computed from constants alone**: outside the kernels, the largest array that does not derive
  from the inputs and is made by arithmetic (not a broadcast, reshape or slice: those hold no
  more than what they are made from, which is counted above; a broadcast scalar or an iota holds
  nothing but its shape). XLA may fold such an array at compile time, so its work would be free, and it can be
  anything a small program generates (the inputs regenerated from a known seed, say). Inside a
  kernel, what it computes is counted by the estimate like any other work.

Real kernels need little: scalars (the softmax scale, -inf), masks and iotas built in the kernel,
at most tables of a few KiB. ``BUDGET_BYTES`` is set from what the built-in seeds, JAX's Pallas TPU
kernels and every kernel of a default run hold (the README lists the figures); an output-sized
constant is never legitimate.

What this cannot see: information spread over equation *parameters* that are not arrays (slice
indices, shapes), at a few bytes per equation; the wire caps a program at 64 MiB and the compile
budget bounds its size, and the secret inputs make such a program wrong anyway.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from evaluator.program.traced import kernel_name

BUDGET_BYTES = 16 << 10
# Equations whose result, from scalars and iotas alone, is still a scalar's broadcast or an iota.
_SHAPE_ONLY = {"broadcast_in_dim", "iota", "convert_element_type", "reshape", "squeeze",
               "expand_dims", "transpose", "slice", "copy", "copy_p"}
_INPUT, _SHAPE, _CONST = "input", "shape", "const"


@dataclasses.dataclass(frozen=True)
class ConstantReport:
    data_bytes: int = 0          # every constant and literal, at any depth
    largest_data: str = ""       # the largest one, for a message
    computed_bytes: int = 0      # the largest array computed outside the kernels from constants alone
    largest_computed: str = ""

    def problem(self, budget: int = BUDGET_BYTES) -> str | None:
        """Why the program is refused (one line naming the sizes), or None."""
        if self.data_bytes > budget:
            return (f"refused: the program carries {self.data_bytes:,} bytes of constants (the largest: "
                    f"{self.largest_data}), over the budget of {budget:,}: outputs or inputs cannot be "
                    "smuggled in as data; compute tables in the kernel from iotas, or keep them under the budget")
        if self.computed_bytes > budget:
            return (f"refused: the program computes {self.largest_computed} ({self.computed_bytes:,} bytes) "
                    f"from constants alone, outside its kernels, over the budget of {budget:,}: XLA may "
                    "fold it at compile time (free work); build it inside the kernel, or from the inputs")
        return None


def _nbytes(value) -> int:
    try:
        return int(np.asarray(value).nbytes)
    except Exception:  # noqa: BLE001 - something array-like we cannot size: count it as large
        return 1 << 40


def _describe(value, where: str) -> str:
    try:
        array = np.asarray(value)
        return f"{array.dtype}{list(array.shape)} in {where}"
    except Exception:  # noqa: BLE001
        return f"a {type(value).__name__} in {where}"


class _Walk:
    def __init__(self) -> None:
        self.data = 0
        self.largest = (0, "")
        self.computed = (0, "")
        self._seen: set[int] = set()

    def constant(self, value, where: str) -> None:
        n = _nbytes(value)
        self.data += n
        if n > self.largest[0]:
            self.largest = (n, _describe(value, where))

    def params(self, value, where: str, depth: int = 0) -> None:
        """Every constant reachable from an equation's parameters (nested jaxprs, arrays)."""
        from jax._src import core as jcore

        if depth > 12 or value is None or isinstance(value, (str, bytes, bool, int, float, complex)):
            return
        if id(value) in self._seen:
            return
        self._seen.add(id(value))
        if isinstance(value, jcore.ClosedJaxpr):
            for c in value.consts:
                self.constant(c, where)
            self.jaxpr(value.jaxpr, where, outside=False)
        elif isinstance(value, jcore.Jaxpr):
            self.jaxpr(value, where, outside=False)
        elif isinstance(value, (np.ndarray, np.generic)) or type(value).__name__ == "TypedNdArray":
            self.constant(value, where)
        elif isinstance(value, dict):
            for v in value.values():
                self.params(v, where, depth + 1)
        elif isinstance(value, (tuple, list, frozenset, set)):
            for v in value:
                self.params(v, where, depth + 1)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                self.params(getattr(value, field.name, None), where, depth + 1)

    def jaxpr(self, jaxpr, where: str, *, outside: bool, kinds: list[str] | None = None) -> list[str]:
        """Count ``jaxpr``'s literals and nested constants; outside the kernels, also follow which
        values derive from the inputs (``kinds`` of its invars) and return the kinds of its outvars."""
        from jax._src import core as jcore

        env: dict = {}
        if outside:
            env.update(zip(jaxpr.invars, kinds or [_INPUT] * len(jaxpr.invars)))
            env.update(dict.fromkeys(jaxpr.constvars, _CONST))

        def kind(v) -> str:
            return _SHAPE if isinstance(v, jcore.Literal) else env.get(v, _INPUT)

        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            here = where if name != "pallas_call" else f"kernel '{kernel_name(eqn)}'"
            for v in eqn.invars:
                if isinstance(v, jcore.Literal):
                    self.constant(v.val, f"{where}: a literal of {name}")
            inner = outside and name != "pallas_call"
            sub = _call_jaxpr(eqn) if inner else None
            if sub is not None:     # a call: follow the values through its body
                jaxpr_, consts = sub
                for c in consts:
                    self.constant(c, here)
                outs = self.jaxpr(jaxpr_, here, outside=True, kinds=[kind(v) for v in eqn.invars])
                others = {k: v for k, v in eqn.params.items() if v is not jaxpr_ and getattr(v, "jaxpr", None)
                          is not jaxpr_}
                self.params(others, here)
            else:
                self.params(eqn.params, here)
                outs = self._outs(eqn, [kind(v) for v in eqn.invars]) if outside else []
            for v, k in zip(eqn.outvars, outs):
                env[v] = k
                if k == _CONST and name not in _SHAPE_ONLY and hasattr(v.aval, "shape"):
                    n = int(np.prod(v.aval.shape, dtype=np.int64)) * np.dtype(v.aval.dtype).itemsize
                    if n > self.computed[0]:
                        self.computed = (n, f"{v.aval.str_short()} by {name} in {where}")
        return [kind(v) for v in jaxpr.outvars] if outside else []

    @staticmethod
    def _outs(eqn, kinds: list[str]) -> list[str]:
        n = len(eqn.outvars)
        if eqn.primitive.name == "pallas_call" or _INPUT in kinds:
            return [_INPUT] * n       # a kernel's work is counted by the estimate, whatever it reads
        if eqn.primitive.name in _SHAPE_ONLY and all(k == _SHAPE for k in kinds):
            return [_SHAPE] * n
        return [_CONST] * n


def _call_jaxpr(eqn):
    """(jaxpr, consts) of a call-like equation whose operands are its body's inputs one for one
    (pjit, closed_call, remat, custom calls), or None."""
    from jax._src import core as jcore

    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(key)
        if isinstance(body, jcore.ClosedJaxpr) and len(body.jaxpr.invars) == len(eqn.invars):
            return body.jaxpr, body.consts
        if isinstance(body, jcore.Jaxpr) and len(body.invars) == len(eqn.invars) and not body.constvars:
            return body, ()
    return None


def report(closed) -> ConstantReport:
    """What ``closed`` (the candidate's ClosedJaxpr, as the runner rebuilt it) holds as data."""
    walk = _Walk()
    for c in closed.consts:
        walk.constant(c, "the program's constants")
    walk.jaxpr(closed.jaxpr, "the program", outside=True,
               kinds=[_INPUT] * len(closed.jaxpr.invars))
    return ConstantReport(walk.data, walk.largest[1], walk.computed[0], walk.computed[1])
