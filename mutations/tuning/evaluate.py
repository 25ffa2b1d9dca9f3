"""Sizes at a task's shapes: what an expression of a kernel's wrapper evaluates to, without running it.

A block's legal values come from the array its ``BlockSpec`` maps, and that array is often not an
input as the task gives it: the wrapper reshapes it (``a2 = A.reshape(N * M, K)``), transposes it
(``x.T``, ``jnp.transpose(w)``), casts it, or the output is declared with its own shape
(``out_shape=jax.ShapeDtypeStruct((N * M, L), A.dtype)``). :class:`Scope` evaluates such expressions
in one function from the shapes of its parameters: integers and their arithmetic, ``x.shape``,
tuples, ``min``/``max``, comparisons (a ``while``'s test, to know which block values a loop leaves
alone), and arrays through ``reshape`` (``-1`` included), ``.T``, ``transpose``, ``swapaxes`` and
``astype``. Whatever it cannot follow is :data:`NA`; nothing here runs the kernel.

:func:`inputs` says what each function's parameters hold: the entry's positional parameters are the
task's inputs (a model class's ``forward``: its inputs, then the weights, held in ``self``'s
attributes), handed on through the calls of the module's functions and methods.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any

import libcst as cst

from . import names as N


class _NA:
    def __repr__(self) -> str:
        return "NA"


NA: Any = _NA()         # not known at this shape
MAX_DEPTH = 48
MAX_LOOPS = 64      # the iterations of a wrapper's loop run to know a block
DTYPES = {"float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "bool_", "float8_e4m3fn", "float8_e5m2", "int4"}


@dataclasses.dataclass(frozen=True)
class Array:
    """An array's shape and dtype (the dtype's name, as numpy spells it)."""

    shape: tuple[int, ...]
    dtype: str


def _known(*values: Any) -> bool:
    return all(v is not NA for v in values)


_BINARY = {cst.Add: operator.add, cst.Subtract: operator.sub, cst.Multiply: operator.mul,
           cst.FloorDivide: operator.floordiv, cst.Modulo: operator.mod, cst.LeftShift: operator.lshift,
           cst.RightShift: operator.rshift, cst.Power: operator.pow, cst.Divide: operator.truediv,
           cst.BitAnd: operator.and_, cst.BitOr: operator.or_}
_COMPARE = {cst.Equal: operator.eq, cst.NotEqual: operator.ne, cst.LessThan: operator.lt,
            cst.LessThanEqual: operator.le, cst.GreaterThan: operator.gt, cst.GreaterThanEqual: operator.ge,
            cst.Is: operator.is_, cst.IsNot: operator.is_not, cst.In: lambda a, b: a in b,
            cst.NotIn: lambda a, b: a not in b}


def _reshape(array: Array, dims: Any) -> Any:
    if not isinstance(dims, tuple) or not all(isinstance(d, int) for d in dims):
        return NA
    total = math.prod(array.shape)
    if dims.count(-1) == 1:
        rest = math.prod(d for d in dims if d != -1)
        if rest <= 0 or total % rest:
            return NA
        dims = tuple(total // rest if d == -1 else d for d in dims)
    return Array(dims, array.dtype) if math.prod(dims) == total else NA


def _transpose(array: Array, axes: Any) -> Any:
    rank = len(array.shape)
    if axes is None:
        axes = tuple(reversed(range(rank)))
    if not isinstance(axes, tuple) or sorted(a % rank for a in axes if isinstance(a, int)) != list(range(rank)):
        return NA
    return Array(tuple(array.shape[a] for a in axes), array.dtype)


class Scope:
    """Evaluates expressions of the function ``key`` (None: the module's top level), its parameters
    holding ``known`` (``{"x": Array(...), "self.weight": Array(...), "n": 128}``) and the names of
    ``override`` holding the values given (a block value tried against a loop's test)."""

    def __init__(self, tables: N.Tables, key: str | None, known: dict[str, Any] | None = None,
                 override: dict[str, Any] | None = None) -> None:
        self.tables, self.key = tables, key
        self.fn = tables.function(key)
        self.known = known or {}
        self.override = override or {}
        self._active: set[str] = set()

    def with_value(self, var: str, value: Any) -> Scope:
        return Scope(self.tables, self.key, self.known, {**self.override, var: value})

    def truth(self, expr: cst.BaseExpression, depth: int = 0) -> Any:
        """The test's truth at this shape, or NA."""
        value = self.value(expr, depth)
        return NA if value is NA else bool(value)

    def value(self, expr: cst.BaseExpression, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            return NA
        try:
            return self._value(expr, depth + 1)
        except (ArithmeticError, TypeError, ValueError, IndexError, OverflowError):
            return NA

    def _value(self, e: cst.BaseExpression, d: int) -> Any:
        if isinstance(e, cst.Integer):
            return int(e.evaluated_value)
        if isinstance(e, cst.Float):
            return float(e.evaluated_value)
        if isinstance(e, cst.SimpleString):
            return e.evaluated_value
        if isinstance(e, (cst.Tuple, cst.List)):
            if any(not isinstance(el, cst.Element) for el in e.elements):
                return NA
            return tuple(self.value(el.value, d) for el in e.elements)
        if isinstance(e, cst.Name):
            return self._name(e.value, d)
        if isinstance(e, cst.Attribute):
            return self._attribute(e, d)
        if isinstance(e, cst.Subscript):
            return self._subscript(e, d)
        if isinstance(e, cst.BinaryOperation):
            left, right = self.value(e.left, d), self.value(e.right, d)
            op = _BINARY.get(type(e.operator))
            return op(left, right) if op is not None and _known(left, right) else NA
        if isinstance(e, cst.UnaryOperation):
            v = self.value(e.expression, d)
            if v is NA:
                return NA
            return {cst.Minus: operator.neg, cst.Plus: operator.pos, cst.Not: operator.not_,
                    cst.BitInvert: operator.invert}[type(e.operator)](v)
        if isinstance(e, cst.Comparison):
            return self._compare(e, d)
        if isinstance(e, cst.BooleanOperation):
            left = self.value(e.left, d)
            if isinstance(e.operator, cst.And):
                return False if left is not NA and not left else self._and(left, self.value(e.right, d))
            return left if left is not NA and left else self._or(left, self.value(e.right, d))
        if isinstance(e, cst.IfExp):
            test = self.value(e.test, d)
            return NA if test is NA else self.value(e.body if test else e.orelse, d)
        if isinstance(e, cst.Call):
            return self._call(e, d)
        return NA

    @staticmethod
    def _and(left: Any, right: Any) -> Any:
        if right is not NA and not right:
            return right
        return NA if NA in (left, right) else right

    @staticmethod
    def _or(left: Any, right: Any) -> Any:
        if right is not NA and right:
            return right
        return NA if NA in (left, right) else right

    def _compare(self, e: cst.Comparison, d: int) -> Any:
        left = self.value(e.left, d)
        for target in e.comparisons:
            right = self.value(target.comparator, d)
            op = _COMPARE.get(type(target.operator))
            if op is None or not _known(left, right):
                return NA
            if not op(left, right):
                return False
            left = right
        return True

    # ---- names ---------------------------------------------------------------------------------
    def _name(self, var: str, d: int) -> Any:
        if var in self.override:
            return self.override[var]
        if var in ("None", "True", "False"):
            return {"None": None, "True": True, "False": False}[var]
        if self.fn is not None:
            if var not in self._active:
                self._active.add(var)
                try:
                    found = self._local(var, d)
                finally:
                    self._active.discard(var)
                if found is not None:
                    return found[0]
            for p in N.params(self.fn):
                if p.name.value == var:
                    if var in self.known:
                        return self.known[var]
                    return Scope(self.tables, None).value(p.default, d) if p.default is not None else NA
        if var in self.tables.constants:
            return Scope(self.tables, None).value(self.tables.constants[var], d)
        return NA

    def _local(self, var: str, d: int) -> tuple[Any] | None:
        """(value,) of a local binding of ``var``, None where the function binds it nowhere
        unconditionally (a parameter's value then flows)."""
        chosen, guards, loose = N.visible(self.fn, self.key, var, lambda test: self.truth(test, d))
        if chosen is None:
            return (NA,) if loose is not None else None
        if chosen.value is None or loose is not None:
            return (NA,)
        value = self.value(chosen.value, d)
        if chosen.index is not None:
            value = value[chosen.index] if isinstance(value, tuple) and chosen.index < len(value) else NA
        for g in guards:             # a rebinding under a test: run it, where its body is simple
            value = self._run(g, var, value, d)
        return (value,)

    def _run(self, guard: N.Guard, var: str, value: Any, d: int) -> Any:
        """``var``'s value past ``guard``: unchanged where its test leaves it alone; else the
        ``while`` loop (or ``if``) run here, when its body only assigns ``var`` (``bm //= 2``)."""
        for _ in range(MAX_LOOPS):
            if value is NA:
                return NA
            truth = self.with_value(var, value).truth(guard.test, d)
            if truth is NA:
                return NA
            if truth == guard.want:
                return value
            value = self._step(guard, var, value, d)
            if guard.kind == "if":
                return value
        return NA

    def _step(self, guard: N.Guard, var: str, value: Any, d: int) -> Any:
        if guard.want is True and not isinstance(guard.node.orelse, cst.Else):
            return NA                    # an ``elif``'s: its own test comes first
        body = guard.node.body if guard.want is False else guard.node.orelse.body
        statements = list(getattr(body, "body", ()))
        if isinstance(body, cst.IndentedBlock):
            if not all(isinstance(s, cst.SimpleStatementLine) for s in statements):
                return NA
            statements = [small for s in statements for small in s.body]
        for small in statements:
            scope = self.with_value(var, value)
            if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) and small.target.value == var:
                op = _BINARY.get(getattr(cst, type(small.operator).__name__.removesuffix("Assign"), None))
                right = scope.value(small.value, d)
                value = op(value, right) if op is not None and _known(right) else NA
            elif isinstance(small, cst.Assign) and len(small.targets) == 1 and \
                    isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == var:
                value = scope.value(small.value, d)
            else:
                return NA
        return value

    def _attribute(self, e: cst.Attribute, d: int) -> Any:
        attr = e.attr.value
        if isinstance(e.value, cst.Name) and e.value.value in ("jnp", "np", "numpy", "jax") and attr in DTYPES:
            return attr
        if isinstance(e.value, cst.Name) and e.value.value == "self":
            return self.known.get(f"self.{attr}", NA)
        base = self.value(e.value, d)
        if isinstance(base, Array):
            return {"shape": base.shape, "dtype": base.dtype, "ndim": len(base.shape), "size": math.prod(base.shape),
                    "T": Array(tuple(reversed(base.shape)), base.dtype)}.get(attr, NA)
        return NA

    def _subscript(self, e: cst.Subscript, d: int) -> Any:
        base = self.value(e.value, d)
        if not isinstance(base, tuple) or len(e.slice) != 1:
            return NA
        s = e.slice[0].slice
        if isinstance(s, cst.Index):
            i = self.value(s.value, d)
            return base[i] if isinstance(i, int) else NA
        if isinstance(s, cst.Slice):
            parts = [None if p is None else self.value(p, d) for p in (s.lower, s.upper, s.step)]
            return base[slice(*parts)] if _known(*parts) else NA
        return NA

    # ---- calls ---------------------------------------------------------------------------------
    def _call(self, e: cst.Call, d: int) -> Any:
        name = N.callee(e)
        positional = [a for a in e.args if a.keyword is None and not a.star]
        keywords = {a.keyword.value: a.value for a in e.args if a.keyword is not None}
        args = [self.value(a.value, d) for a in positional]
        method = isinstance(e.func, cst.Attribute)
        owner = self.value(e.func.value, d) if method and name in ("reshape", "astype", "transpose") else NA
        if isinstance(owner, Array):                          # x.reshape(...), x.astype(...), x.T
            if name == "reshape":
                return _reshape(owner, args[0] if len(args) == 1 and isinstance(args[0], tuple) else tuple(args))
            if name == "astype":
                return Array(owner.shape, args[0]) if args and isinstance(args[0], str) else NA
            return _transpose(owner, (args[0] if len(args) == 1 and isinstance(args[0], tuple) else tuple(args))
                              if args else None)
        if name in ("min", "max", "sum"):
            values = args[0] if len(args) == 1 and isinstance(args[0], tuple) else tuple(args)
            return {"min": min, "max": max, "sum": sum}[name](values) if values and _known(*values) else NA
        if name in ("abs", "int", "len", "bool", "tuple") and len(args) == 1 and _known(args[0]):
            return {"abs": abs, "int": int, "len": len, "bool": bool, "tuple": tuple}[name](args[0])
        if name == "callable" and len(args) == 1 and _known(args[0]):
            return False                     # what this evaluates is data: ints, tuples, arrays
        if name == "prod" and len(args) == 1 and isinstance(args[0], tuple) and _known(*args[0]):
            return math.prod(args[0])
        if name == "cdiv" and len(args) == 2 and _known(*args):
            return -(-args[0] // args[1])
        if name == "ShapeDtypeStruct":
            shape = args[0] if args else self.value(keywords.get("shape", cst.Name("None")), d)
            dtype = args[1] if len(args) > 1 else self.value(keywords.get("dtype", cst.Name("None")), d)
            if isinstance(shape, tuple) and all(isinstance(s, int) for s in shape):
                return Array(shape, dtype if isinstance(dtype, str) else "float32")
            return NA
        if not (method and isinstance(e.func.value, cst.Name) and e.func.value.value in ("jnp", "np", "jax")):
            return NA
        array = args[0] if args else NA
        if not isinstance(array, Array):
            return NA
        if name in ("asarray", "array"):
            return array
        if name == "reshape":
            given = keywords.get("newshape", keywords.get("shape"))
            shape = args[1] if len(args) > 1 else self.value(given, d) if given is not None else NA
            return _reshape(array, shape if isinstance(shape, tuple) else (shape,))
        if name == "transpose":
            axes = args[1] if len(args) > 1 else (self.value(keywords["axes"], d) if "axes" in keywords else None)
            return _transpose(array, axes)
        if name == "swapaxes" and len(args) == 3 and isinstance(args[1], int) and isinstance(args[2], int):
            axes = list(range(len(array.shape)))
            axes[args[1]], axes[args[2]] = axes[args[2]], axes[args[1]]
            return _transpose(array, tuple(axes))
        return NA


# ---- what each function's parameters hold ------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _aliases(tables: N.Tables) -> dict[str, tuple[str, int]]:
    """Module-level names bound to a function: ``f2 = f`` or ``f2 = functools.partial(f, a, ...)``:
    name -> (the function, how many positional arguments the partial fixes)."""
    out = {}
    for name, value in tables.constants.items():
        fixed = 0
        if isinstance(value, cst.Call) and N.callee(value) == "partial" and value.args:
            fixed = sum(1 for a in value.args[1:] if a.keyword is None)
            value = value.args[0].value
        if isinstance(value, cst.Name) and isinstance(tables.defs.get(value.value), cst.FunctionDef):
            out[name] = (value.value, fixed)
    return out


def called(tables: N.Tables, key: str, call: cst.Call) -> tuple[str, int] | None:
    """The definition a call in ``key`` runs (a function, an alias of one, ``self.method``, a class's
    ``__init__``) and how many of its positional parameters are filled before the call's own."""
    name = N.callee(call)
    if isinstance(call.func, cst.Name):
        if name in _aliases(tables):
            return _aliases(tables)[name]
        if isinstance(tables.defs.get(name), cst.FunctionDef):
            return name, 0
        if isinstance(tables.defs.get(name), cst.ClassDef) and f"{name}.__init__" in tables.defs:
            return f"{name}.__init__", 0
    elif isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name) and N.is_method(key):
        owner = call.func.value.value
        cls = key.split(".")[0] if owner == "self" else owner
        if f"{cls}.{name}" in tables.defs:
            return f"{cls}.{name}", 0
    return None


def _weights(tables: N.Tables, cls: str, names: tuple[str, ...]) -> list[str]:
    """The attributes a model class holds its weights in, in the order its ``__init__`` sets them:
    the task's names for them where its ``__init__`` sets each, else every ``self.<attr> = <call>``
    (``self.weight = jnp.zeros((k, n))``; sizes and flags are set from names and literals)."""
    init = tables.function(f"{cls}.__init__")
    if init is None:
        return list(names)
    assigned = [(t.attr.value, small.value) for stmt in init.body.body if isinstance(stmt, cst.SimpleStatementLine)
                for small in stmt.body if isinstance(small, cst.Assign) and len(small.targets) == 1
                for t in [small.targets[0].target]
                if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self"]
    if names and all(n in dict(assigned) for n in names):
        return list(names)
    return [attr for attr, value in assigned if isinstance(value, cst.Call)]


def inputs(tables: N.Tables, entry: str, specs: tuple, names: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Definition -> {parameter (or ``self.<attr>``): what it holds at the task's shapes}: the
    entry's positional parameters take the task's inputs in order (a method's extra inputs are its
    class's weights), handed on through every call whose arguments evaluate (arrays, reshaped or
    not, and integers); a definition called with different values keeps the first."""
    fn = tables.function(entry)
    if fn is None:
        return {}
    arrays = [Array(tuple(shape), dtype) for shape, dtype in specs]
    params = [p.name.value for p in N.positional(fn, entry)]
    first: dict[str, Any] = dict(zip(params, arrays))
    if N.is_method(entry) and len(arrays) > len(params):
        cls = entry.split(".")[0]
        weights = _weights(tables, cls, tuple(names[len(params):len(arrays)]))
        first.update({f"self.{a}": arr for a, arr in zip(weights, arrays[len(params):])})
    out = {entry: first}
    todo = [entry]
    for _ in range(64 * max(1, len(tables.defs))):
        if not todo:
            break
        key = todo.pop()
        scope = Scope(tables, key, out[key])
        for call in _calls(tables, key):
            target = called(tables, key, call)
            if target is None or target[0] == key:
                continue
            callee, fixed = target
            fn = tables.function(callee)
            params = [p.name.value for p in N.positional(fn, callee)][fixed:]
            mapped = dict(out.get(callee, {}))
            if N.is_method(callee) and callee.split(".")[0] == key.split(".")[0]:
                mapped.update({k: v for k, v in out[key].items() if k.startswith("self.") and k not in mapped})
            for i, arg in enumerate(call.args):
                if arg.star:
                    continue
                param = arg.keyword.value if arg.keyword is not None else (params[i] if i < len(params) else None)
                if param is None or param in mapped:
                    continue
                value = scope.value(arg.value)
                if isinstance(value, (Array, int)) and not isinstance(value, bool):
                    mapped[param] = value
            if mapped != out.get(callee):
                out[callee] = mapped
                todo.append(callee)
    return out


def _calls(tables: N.Tables, key: str) -> tuple[cst.Call, ...]:
    return tables.by_caller.get(key, ())
