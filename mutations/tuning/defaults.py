"""A block parameter the entry leaves to its caller, given a default.

JAX's ``matmul(x, y, *, block_shape, block_k=256)`` cannot run as a task's entry: ``block_shape``
has no default. ``required_defaults`` finds each such keyword-only parameter that discovery follows
into a BlockSpec and writes the legal value nearest START in its place, so the kernel becomes one
the search can move."""
from __future__ import annotations

import math
from typing import Any

import libcst as cst

from .. import _sites
from .block_fields import set_literals
from . import names as N
from .discovery import discover

START = 256      # where a required block parameter starts: the legal value nearest it (log scale)
ARITIES = (1, 2, 3)


def _with_default(module: cst.Module, target: cst.FunctionDef, param: str, default: cst.BaseExpression
                  ) -> cst.Module:
    """``module`` with ``param`` of the function (or method) ``target`` given ``default`` (a keyword-only one keeps
    its place; a positional one is left alone: a default there would move the ones after it)."""

    class T(cst.CSTTransformer):
        def leave_FunctionDef(self, original, updated):
            if original is not target:
                return updated
            equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                    whitespace_after=cst.SimpleWhitespace(""))
            kwonly = [p.with_changes(default=default, equal=equal)
                      if p.name.value == param and p.default is None else p for p in updated.params.kwonly_params]
            return updated.with_changes(params=updated.params.with_changes(kwonly_params=kwonly))

    return module.visit(T())


def _nearest(legal: tuple[int, ...], value: int = START) -> int:
    return min(legal, key=lambda v: (abs(math.log2(v) - math.log2(value)), -v))


def required_defaults(module: cst.Module, task: Any) -> tuple[cst.Module, dict[str, Any]]:
    """The entry's keyword-only parameters that have no default and flow into a block shape (JAX's
    ``matmul(x, y, *, block_shape, block_k=256)``: ``l, r = block_shape``), each given one: its
    legal values nearest START, found by trying an integer or a tuple of 1 to 3 of them and keeping
    what discovery then follows into the BlockSpecs. Returns the module and ``{param: default}``
    ({} when nothing is missing): a kernel that cannot run as written becomes one the search moves."""
    with _sites.scope(task):
        return _required_defaults(module, task)


def _required_defaults(module: cst.Module, task: Any) -> tuple[cst.Module, dict[str, Any]]:
    entry = getattr(task, "entry", None)
    fn = N.tables(module).function(entry)
    if fn is None:
        return module, {}
    given: dict[str, Any] = {}
    for param in fn.params.kwonly_params:
        if param.default is not None:
            continue
        best: tuple[cst.Module, Any] | None = None
        for arity in ARITIES:
            marks = [START + 7 + k for k in range(arity)]    # values no kernel writes, to find again
            text = str(marks[0]) if arity == 1 else f"({', '.join(map(str, marks))})"
            trial = _with_default(module, fn, param.name.value, cst.parse_expression(text))
            found = {t.value: t for t in discover(trial, task).values()}
            if not all(m in found for m in marks):
                continue
            values = [_nearest(found[m].legal) for m in marks]
            moved = set_literals(trial, {id(lit): v for m, v in zip(marks, values) for lit in found[m].literals})
            best = (moved, values[0] if arity == 1 else tuple(values))
            break
        if best is not None:
            module, given[param.name.value] = best
    return module, given
