"""Following one element of a block shape back to the integer literals that set it, or saying why not.

An element of a ``BlockSpec``'s block shape is followed through local assignments (the binding a
use sees, mutations/tuning/names.py), tuple unpacking and subscripts, ``min``/``max``, parameters
(their defaults and the keyword, positional or ``functools.partial`` arguments of their callers,
methods and a class's ``__init__`` included), attributes (a dataclass's field defaults, a call's
``field=`` keyword, ``self.block_m = ...`` in a method), module constants, a conditional expression
and an ``if`` on the shape (the branch the task's shape takes), and a helper's ``return`` (one that
returns once and is called once). The result is a list
of :class:`Hit`, each literal with the names its value passed through (the tunable is named after
them: the name nearest the literal that every hit shares) and the guards it must pass (a ``while``
that recomputes it, the other side of a ``min``); or a :class:`Why`: what the element came to and
why discovery stops there (a whole dimension of an input, a call it does not follow, ...).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import libcst as cst

from .._cst import code
from .._walk import walk
from . import names as N
from .evaluate import called

MAX_DEPTH = 10


@dataclasses.dataclass(frozen=True)
class Hit:
    """A literal that sets the element, the names its value passes through (from the BlockSpec
    towards the literal) and the guards on it."""

    literal: cst.Integer
    names: tuple[str, ...]
    guards: tuple[N.Guard, ...]


@dataclasses.dataclass(frozen=True)
class Why:
    """Why an element is not followed: ``what`` it came to (code) and ``why`` (a phrase, its
    ``{0}``, ``{1}`` the lines of the nodes ``at``). ``whole``: a whole dimension of an array."""

    what: str
    why: str
    at: tuple[cst.CSTNode, ...] = ()
    whole: bool = False


SKIP = Why("", "no block: a squeezed dimension")      # ``None`` / ``pl.Squeezed()`` in a block shape


def _label(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    return None


def _kind(node: cst.CSTNode) -> str:
    return {cst.For: "`for` loop", cst.While: "`while` loop", cst.If: "`if`", cst.Try: "`try`"}.get(
        type(node), "statement")


@functools.lru_cache(maxsize=256)
def _attribute_sets(tables: N.Tables) -> dict[str, tuple[tuple[str, cst.BaseExpression], ...]]:
    """``<obj>.<attr> = value`` in any function or method: attr -> ((definition, value), ...)."""
    out: dict[str, list[tuple[str, cst.BaseExpression]]] = {}
    for key, node in tables.defs.items():
        if not isinstance(node, cst.FunctionDef):
            continue
        for n in walk(node):
            if isinstance(n, cst.Assign):
                for t in n.targets:
                    if isinstance(t.target, cst.Attribute):
                        out.setdefault(t.target.attr.value, []).append((key, n.value))
    return {k: tuple(v) for k, v in out.items()}


class Follower:
    """Follows expressions of the module's functions; ``decide(key)`` gives the test evaluator of
    the function ``key`` at the task's shapes (an ``if`` it decides is no condition)."""

    def __init__(self, tables: N.Tables, decide: Callable[[str | None], N.Decide | None]) -> None:
        self.tables = tables
        self.decide = decide

    def follow(self, expr: cst.BaseExpression, key: str | None, index: int | None = None) -> list[Hit] | Why:
        return self._go(expr, key, index, (), (), 0)

    def _go(self, e, key, index, names, guards, depth) -> list[Hit] | Why:
        if depth > MAX_DEPTH:
            return Why(code(e), f"followed through more than {MAX_DEPTH} steps")
        if isinstance(e, (cst.Tuple, cst.List)):
            if index is None or index >= len(e.elements) or not isinstance(e.elements[index], cst.Element):
                return Why(code(e), "a tuple, not one size")
            return self._go(e.elements[index].value, key, None, names, guards, depth + 1)
        if isinstance(e, cst.Name) and e.value == "None":
            return SKIP
        if isinstance(e, cst.Integer):
            return [Hit(e, names, guards)] if index is None else Why(code(e), "an integer, not a tuple")
        if isinstance(e, cst.Subscript):
            return self._subscript(e, key, index, names, guards, depth)
        if isinstance(e, cst.Call):
            return self._call(e, key, index, names, guards, depth)
        if isinstance(e, cst.Name):
            return self._name(e.value, key, index, names, guards, depth)
        if isinstance(e, cst.Attribute):
            if e.attr.value in ("shape", "ndim", "size"):
                what = code(e) + (f"[{index}]" if index is not None else "")
                return Why(what, f"a whole dimension of `{code(e.value)}`, not tuned", whole=True)
            if "squeezed" in e.attr.value.lower():
                return SKIP
            return self._field(e, key, index, names, guards, depth)
        if isinstance(e, cst.IfExp):
            decide = self.decide(key)
            taken = decide(e.test) if decide is not None else None
            if taken is True or taken is False:
                return self._go(e.body if taken else e.orelse, key, index, names, guards, depth + 1)
            return Why(code(e), "chosen by a test discovery cannot evaluate at this shape")
        if isinstance(e, cst.BinaryOperation):
            return Why(code(e), "computed by arithmetic, not a literal discovery can set")
        return Why(code(e), "not a literal discovery can follow")

    def _subscript(self, e, key, index, names, guards, depth):
        s = e.slice[0].slice if len(e.slice) == 1 else None
        i = None
        if isinstance(s, cst.Index) and isinstance(s.value, cst.Integer):
            i = int(s.value.evaluated_value)
        elif isinstance(s, cst.Index) and isinstance(s.value, cst.UnaryOperation) and \
                isinstance(s.value.operator, cst.Minus) and isinstance(s.value.expression, cst.Integer):
            i = -int(s.value.expression.evaluated_value)
        if i is None or index is not None:
            return Why(code(e), "an element discovery cannot locate")
        if isinstance(e.value, cst.Attribute) and e.value.attr.value == "shape":
            return Why(code(e), f"a whole dimension of `{code(e.value.value)}`, not tuned", whole=True)
        return self._go(e.value, key, i, names, guards, depth + 1)

    def _call(self, e, key, index, names, guards, depth):
        name = N.callee(e)
        if name and "squeezed" in name.lower():
            return SKIP
        if name in ("min", "max") and index is None:
            args = [a.value for a in e.args if a.keyword is None and not a.star]
            for arg in args:
                found = self._go(arg, key, None, names, guards, depth + 1)
                if isinstance(found, list):
                    more = tuple(N.Guard(key, name, o, None, True, e) for o in args if o is not arg)
                    return [dataclasses.replace(h, guards=h.guards + more) for h in found]
            return Why(code(e), f"the {name} of values none of which is followed to a literal")
        target = called(self.tables, key, e) if key is not None else None
        returned = self._returned(target[0]) if target is not None and target[1] == 0 else None
        if returned is not None:
            return self._go(returned, target[0], index, names, guards, depth + 1)
        return Why(code(e), "a call discovery does not follow")

    def _returned(self, key: str) -> cst.BaseExpression | None:
        """What the function ``key`` returns, where it returns once (its last statement) and the
        module calls it once: a helper that picks a block (``return b`` after a loop) is followed
        into; one called for several blocks would tie them to one literal, and is not."""
        fn = self.tables.function(key)
        if fn is None or not fn.body.body:
            return None
        last = fn.body.body[-1]
        small = last.body[0] if isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 else None
        if not isinstance(small, cst.Return) or small.value is None or \
                sum(isinstance(n, cst.Return) for n in walk(fn)) != 1:
            return None
        uses = sum(1 for c in self.tables.calls if N.callee(c) == fn.name.value)
        return small.value if uses == 1 else None

    # ---- names -------------------------------------------------------------------------------
    def _name(self, var, key, index, names, guards, depth):
        label = var if index is None else f"{var}[{index}]"
        names = names + (label,)
        fn = self.tables.function(key)
        if fn is not None:
            chosen, more, loose = N.visible(fn, key, var, self.decide(key))
            if loose is not None:
                return Why(var, f"rebound in the {_kind(loose.node)} at line {{0}}", (loose.node,))
            guards = guards + more
            if chosen is not None:
                if chosen.value is None:
                    return Why(var, "changed in place at line {0}", (chosen.node,))
                if chosen.index is not None:
                    if index is not None:
                        return Why(label, "an element discovery cannot locate")
                    return self._go(chosen.value, key, chosen.index, names, guards, depth + 1)
                return self._go(chosen.value, key, index, names, guards, depth + 1)
            for p in N.params(fn):
                if p.name.value == var:
                    return self._param(key, fn, p, index, names, guards, depth)
            if more:
                return Why(var, f"set only under the {_kind(more[0].node)} at line {{0}}", (more[0].node,))
        if var in self.tables.constants:
            return self._go(self.tables.constants[var], None, index, names, guards, depth + 1)
        return Why(label, "not bound in the module (an import, or a name discovery cannot read)")

    def _param(self, key, fn, param, index, names, guards, depth):
        """A parameter: what its callers pass it (a keyword, a partial's keyword, a positional
        argument: a literal, or a name the caller binds, such as its own parameter), and its
        default. An entry's ``block_rows=32`` handed on to a helper's ``block_rows`` is one
        tunable, the entry's default and the helper's (if any) set together."""
        var, hits, whys = param.name.value, [], []
        position = [p.name.value for p in N.positional(fn, key)]
        called = key.split(".")[0] if key.endswith(".__init__") else fn.name.value
        for call in self.tables.calls:
            args = list(call.args)
            if N.callee(call) == "partial" and args and _label(args[0].value) == called:
                args = args[1:]
            elif N.callee(call) != called:
                continue
            for i, arg in enumerate(args):
                if (arg.keyword is not None and arg.keyword.value == var) or \
                        (arg.keyword is None and not arg.star and i < len(position) and position[i] == var):
                    found = self._go(arg.value, self.tables.caller.get(id(call)), index, names, guards, depth + 1)
                    (hits.extend if isinstance(found, list) else whys.append)(found)
        if param.default is not None:
            found = self._go(param.default, None, index, names, guards, depth + 1)
            (hits.extend if isinstance(found, list) else whys.append)(found)
        if hits:
            return hits
        if whys:
            return whys[0]
        return Why(names[-1], f"a parameter of {key}() with no default, which no call in the module sets")

    def _field(self, e, key, index, names, guards, depth):
        """``obj.attr``: every literal that sets a field ``attr`` in the module: a class body's
        ``attr: T = <int>``, a call's ``attr=<int>`` keyword, an ``<obj>.attr = <value>`` in a
        function or method (``self.block_m = block_m`` in ``__init__``)."""
        attr = e.attr.value
        base = code(e.value) if isinstance(e.value, cst.Name) else None
        label = (f"{base}.{attr}" if base else attr) + (f"[{index}]" if index is not None else "")
        names = names + (label,)
        hits, whys = [], []

        def take(found):
            (hits.extend if isinstance(found, list) else whys.append)(found)

        for cls in (n for n in self.tables.defs.values() if isinstance(n, cst.ClassDef)):
            for stmt in cls.body.body:
                for small in (stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()):
                    target = small.target if isinstance(small, cst.AnnAssign) else \
                        small.targets[0].target if isinstance(small, cst.Assign) and len(small.targets) == 1 else None
                    if isinstance(target, cst.Name) and target.value == attr and small.value is not None:
                        take(self._go(small.value, None, index, names, guards, depth + 1))
        for call in self.tables.calls:
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value == attr:
                    take(self._go(arg.value, self.tables.caller.get(id(call)), index, names, guards, depth + 1))
        for where, value in _attribute_sets(self.tables).get(attr, ()):
            take(self._go(value, where, index, names, guards, depth + 1))
        if hits:
            return hits
        if whys:
            return whys[0]
        return Why(label, "a field no assignment in the module sets")


def common_name(hits: list[Hit]) -> str | None:
    """The name nearest the literals that every hit's value passes through (None: a literal written
    in the block shape itself)."""
    if not hits or not hits[0].names:
        return None
    shared = set(hits[0].names)
    for h in hits[1:]:
        shared &= set(h.names)
    for name in reversed(hits[0].names):
        if name in shared:
            return name
    return hits[0].names[-1]
