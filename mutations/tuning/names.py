"""What binds a name, for discovery: the module's tables and, in a function, which binding a use sees.

Discovery (mutations/tuning/discovery.py) follows a block size back to the literal that sets it; the
evaluator (mutations/tuning/evaluate.py) computes sizes at a task's shapes. Both ask the same
question of a function: which assignment gives ``bm`` its value? A kernel's wrapper may set it once
(``bm = 256``), then change it under a condition (``while M % bm: bm //= 2``,
``if bm > M: bm = M``): an edit of the literal that the condition then changes is undone, so the
binding a use sees is the last one made unconditionally, and each conditional rebinding after it is
a :class:`Guard` (the values the literal may take are those that leave the condition false). An
``if`` whose test does not depend on the name and can be evaluated at the task's shape
(``if M >= 512:``) is not a condition: its branch is taken or not.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import libcst as cst

from .. import _sites
from .._walk import walk

# Branching statements a binding may sit under: its value then depends on a test.
_BRANCHES = (cst.If, cst.While, cst.For, cst.Try)


@dataclasses.dataclass(frozen=True)
class Binding:
    """One assignment of ``var`` in a function."""

    var: str
    value: cst.BaseExpression | None      # None: changed in place (``bm //= 2``) or a loop's target
    index: int | None                     # the element a tuple target takes (``bm, bn = blocks``)
    node: cst.CSTNode                     # the small statement (or loop) that binds it
    under: tuple[tuple[cst.CSTNode, bool], ...]   # enclosing branches; True: in the body, False: else


@dataclasses.dataclass(frozen=True)
class Guard:
    """A condition under which ``var`` is rebound after the binding a use sees: ``want`` is the
    value of ``test`` that leaves it alone (False for a ``while`` or an ``if`` body, True for an
    ``else``). ``kind`` is ``while``/``if``, or ``min``/``max`` (``test``: the other argument,
    which the value must not exceed / fall below)."""

    fn: str | None
    kind: str
    test: cst.BaseExpression
    var: str | None
    want: bool
    node: cst.CSTNode


@dataclasses.dataclass(frozen=True, eq=False)     # one per tree: hashed by identity
class Tables:
    """The module's definitions, constants and calls, read once per tree."""

    module: cst.Module
    defs: dict[str, cst.FunctionDef | cst.ClassDef]
    constants: dict[str, cst.BaseExpression]
    calls: tuple[cst.Call, ...]
    caller: dict[int, str]            # id(call) -> the definition (function or method) holding it
    by_caller: dict[str, tuple[cst.Call, ...]]     # the calls each definition holds

    def function(self, key: str | None) -> cst.FunctionDef | None:
        node = self.defs.get(key or "")
        return node if isinstance(node, cst.FunctionDef) else None


def _module_constants(module: cst.Module) -> dict[str, cst.BaseExpression]:
    out = {}
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target,
                                                                                            cst.Name):
                    out[small.targets[0].target.value] = small.value
                elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value:
                    out[small.target.value] = small.value
    return out


@functools.lru_cache(maxsize=256)   # trees are immutable; nodes hash by identity
def tables(module: cst.Module) -> Tables:
    """The module's tables, from one walk of its tree (a production module's is ~30,000 nodes)."""
    defs = _sites.definitions(module)
    caller: dict[int, str] = {}
    by_caller: dict[str, list[cst.Call]] = {}
    calls: list[cst.Call] = []

    def read(node: cst.CSTNode, key: str | None) -> None:
        for n in walk(node):
            if isinstance(n, cst.Call):
                calls.append(n)
                if key is not None:
                    caller[id(n)] = key
                    by_caller.setdefault(key, []).append(n)

    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            read(stmt, stmt.name.value)
        elif isinstance(stmt, cst.ClassDef):
            for item in stmt.body.body:
                read(item, f"{stmt.name.value}.{item.name.value}" if isinstance(item, cst.FunctionDef) else None)
            for part in (*stmt.decorators, *stmt.bases, *stmt.keywords):
                read(part, None)
        else:
            read(stmt, None)
    return Tables(module, defs, _module_constants(module), tuple(calls), caller,
                  {k: tuple(v) for k, v in by_caller.items()})


def callee(call: cst.Call) -> str | None:
    """The called name: ``f(...)`` -> f, ``obj.f(...)`` -> f."""
    func = call.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def is_method(key: str) -> bool:
    return "." in key


def positional(fn: cst.FunctionDef, key: str = "") -> list[cst.Param]:
    """The positional parameters a caller fills (a method's ``self`` left out)."""
    params = [*fn.params.posonly_params, *fn.params.params]
    static = any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in fn.decorators)
    return params[1:] if is_method(key) and params and not static else params


def params(fn: cst.FunctionDef) -> list[cst.Param]:
    p = fn.params
    return [*p.posonly_params, *p.params, *p.kwonly_params]


# ---- bindings in a function ---------------------------------------------------------------------
def _targets(target: cst.BaseExpression, out: list[tuple[str, int | None]], index: int | None = None) -> None:
    if isinstance(target, cst.Name):
        out.append((target.value, index))
    elif isinstance(target, (cst.Tuple, cst.List)) and index is None:
        for i, el in enumerate(target.elements):
            if isinstance(el, cst.Element) and isinstance(el.value, cst.Name):
                out.append((el.value.value, i))


def _small(small: cst.CSTNode, under, out: list[Binding]) -> None:
    found: list[tuple[str, int | None]] = []
    value = None
    if isinstance(small, cst.Assign):
        for t in small.targets:
            _targets(t.target, found)
        value = small.value
    elif isinstance(small, cst.AnnAssign) and small.value is not None:
        _targets(small.target, found)
        value = small.value
    elif isinstance(small, cst.AugAssign):
        _targets(small.target, found)
        found = [(v, None) for v, _ in found]
    for var, index in found:
        out.append(Binding(var, value, index, small, under))


def _block(suite: cst.BaseSuite) -> list[cst.CSTNode]:
    return list(suite.body)


def _statements(body: list[cst.CSTNode], under, out: list[Binding]) -> None:
    for stmt in body:
        if isinstance(stmt, cst.BaseSmallStatement):          # a one-line suite's (``while m % b: b //= 2``)
            _small(stmt, under, out)
        elif isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            for small in stmt.body:
                _small(small, under, out)
        elif isinstance(stmt, cst.If):
            _statements(_block(stmt.body), under + ((stmt, True),), out)
            if stmt.orelse is not None:
                rest = [stmt.orelse] if isinstance(stmt.orelse, cst.If) else _block(stmt.orelse.body)
                _statements(rest, under + ((stmt, False),), out)
        elif isinstance(stmt, (cst.While, cst.For)):
            if isinstance(stmt, cst.For):
                names: list[tuple[str, int | None]] = []
                _targets(stmt.target, names)
                out += [Binding(v, None, None, stmt, under + ((stmt, True),)) for v, _ in names]
            _statements(_block(stmt.body), under + ((stmt, True),), out)
            if stmt.orelse is not None:
                _statements(_block(stmt.orelse.body), under + ((stmt, False),), out)
        elif isinstance(stmt, cst.With):
            _statements(_block(stmt.body), under, out)
        elif isinstance(stmt, cst.Try):
            _statements(_block(stmt.body), under, out)
            for handler in stmt.handlers:
                _statements(_block(handler.body), under + ((stmt, False),), out)
            for extra in (stmt.orelse, stmt.finalbody):
                if extra is not None:
                    _statements(_block(extra.body), under + ((stmt, False),), out)
        # nested functions and classes bind their own names; what they hold is theirs


@functools.lru_cache(maxsize=4096)   # trees are immutable; nodes hash by identity
def bindings(fn: cst.FunctionDef) -> dict[str, tuple[Binding, ...]]:
    """Every binding of each name in ``fn``'s body, in the source's order."""
    found: list[Binding] = []
    _statements(_block(fn.body), (), found)
    out: dict[str, list[Binding]] = {}
    for b in found:
        out.setdefault(b.var, []).append(b)
    return {k: tuple(v) for k, v in out.items()}


def mentions(node: cst.CSTNode, var: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == var for n in walk(node))


def _none_check(test: cst.BaseExpression, var: str) -> bool:
    """``var is None`` / ``var is not None``: a default being filled in, not a test of its value."""
    return (isinstance(test, cst.Comparison) and isinstance(test.left, cst.Name) and test.left.value == var
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot))
            and isinstance(test.comparisons[0].comparator, cst.Name)
            and test.comparisons[0].comparator.value == "None")


Decide = Callable[[cst.BaseExpression], object]


def visible(fn: cst.FunctionDef, key: str | None, var: str, decide: Decide | None = None
            ) -> tuple[Binding | None, tuple[Guard, ...], Binding | None]:
    """The binding of ``var`` a use in ``fn`` sees (the last one made unconditionally; None when
    there is none), the guards of the conditional rebindings after it, and a rebinding no guard can
    describe (in a ``for`` loop or a ``try``'s handler), if any. ``decide(test)`` evaluates an
    ``if``'s test at the task's shape (True/False, else anything): a decided ``if`` is no condition."""

    def state(b: Binding) -> tuple[bool | None, tuple[cst.CSTNode, bool] | None]:
        for node, in_body in b.under:
            if isinstance(node, cst.If) and decide is not None and \
                    (not mentions(node.test, var) or _none_check(node.test, var)):
                taken = decide(node.test)
                if taken is True or taken is False:
                    if taken != in_body:
                        return False, None
                    continue
            return None, (node, in_body)
        return True, None

    chosen, rest = None, []
    for b in bindings(fn).get(var, ()):
        if isinstance(b.value, cst.Call) and isinstance(b.value.func, cst.Name) and b.value.func.value == var:
            continue     # a parameter that may be a lookup, called (``tiling = tiling(m, n)``): its value flows
        taken, branch = state(b)
        if taken is True:
            chosen, rest = b, []
        elif taken is None:
            rest.append((b, branch))
    guards, seen, loose = [], set(), None
    for b, (node, in_body) in rest:
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, cst.While) and in_body:
            guards.append(Guard(key, "while", node.test, var, False, node))
        elif isinstance(node, cst.If):
            guards.append(Guard(key, "if", node.test, var, not in_body, node))
        else:
            loose = loose or b
    return chosen, tuple(guards), loose
