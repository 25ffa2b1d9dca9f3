"""The ``BlockSpec``s discovery reads: each ``pallas_call`` reachable from the task's entry, each of
its in and out specs, the block shape written there and the array it maps at the task's shapes.

A ``pallas_call`` may sit in a module-level function or in a method (a model class's ``forward``,
KernelBench's convention); its specs may be written in the call, bound to names first, or built in
a grid spec (``pltpu.PrefetchScalarGridSpec(in_specs=...)``). An in spec maps the operand the
kernel is applied to at its position (after the scalar-prefetch operands): an input as the task
gives it or reshaped, transposed or cast by the wrapper (mutations/tuning/evaluate.py evaluates
it). An out spec maps the ``out_shape`` the call declares, else the task's output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import libcst as cst

from .. import _sites
from .._cst import code
from .._walk import walk
from . import names as N
from .evaluate import Array, Scope, called

MAX_STEPS = 8


@dataclasses.dataclass(frozen=True)
class Spec:
    """One BlockSpec of a pallas_call: where it is, its block shape and the array it maps."""

    key: str                              # the function or method calling pallas_call
    call: cst.Call                        # the pallas_call
    nth: int                              # which pallas_call of that function
    where: str                            # ``in_specs[1]``, ``out_specs``
    node: cst.CSTNode                     # the BlockSpec, or what stands for it
    shape: cst.BaseExpression | None      # its block shape (None with ``why``)
    array: Array | None                   # the array it maps at the task's shapes, if known
    why: str | None = None                # why its block shape is not read

    def label(self) -> str:
        """``pl.BlockSpec((bm, K), ...)``: the spec as written, its index map left out."""
        if isinstance(self.node, cst.Call) and self.shape is not None:
            return f"{code(self.node.func)}({' '.join(code(self.shape).split())}, ...)"
        text = " ".join(code(self.node).split())
        return text if len(text) <= 60 else text[:57] + "..."


def is_pallas_call(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and N.callee(node) == "pallas_call"


def keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    """``name=`` of ``call`` or of a grid spec built inside its arguments."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    for arg in call.args:
        if isinstance(arg.value, cst.Call):
            found = keyword(arg.value, name)
            if found is not None:
                return found
    return None


def sites(tables: N.Tables, entry: str | None) -> list[str]:
    """The functions and methods calling ``pallas_call`` reachable from ``entry`` (through the
    names each refers to, ``self.<method>``, the module-level aliases and partials of functions
    they call), in the module's order; every one where the entry is None."""
    module, defs = tables.module, tables.defs
    if entry is None:
        reach = set(defs)
    else:
        reach = set(_sites.reachable(module, entry))
        for name, value in tables.constants.items():       # a partial the reachable functions call
            if isinstance(value, cst.Call) and N.callee(value) == "partial" and value.args:
                value = value.args[0].value
            if isinstance(value, cst.Name) and value.value in defs and \
                    any(name in _sites._names(defs[f]) for f in reach if isinstance(defs[f], cst.FunctionDef)):
                reach |= set(_sites.reachable(module, value.value))
    return [key for key, node in defs.items() if key in reach and isinstance(node, cst.FunctionDef)
            and any(is_pallas_call(n) for n in walk(node))]


def _local(fn: cst.FunctionDef, key: str, expr: cst.BaseExpression, scope: Scope) -> cst.BaseExpression:
    """``expr`` with local names followed to what they are bound to (``x_spec = pl.BlockSpec(...)``)
    and a conditional expression to the branch taken at the task's shapes (``spec if ab is not None
    else None``; where that is not known, the branch that is not None)."""
    for _ in range(MAX_STEPS):
        if isinstance(expr, cst.IfExp):
            taken = scope.truth(expr.test)
            if taken is True or taken is False:
                expr = expr.body if taken else expr.orelse
            else:
                expr = expr.orelse if isinstance(expr.body, cst.Name) and expr.body.value == "None" else expr.body
            continue
        if not isinstance(expr, cst.Name):
            break
        chosen, _, _ = N.visible(fn, key, expr.value, scope.truth)
        if chosen is None or chosen.value is None or chosen.index is not None:
            break
        expr = chosen.value
    return expr


def _items(fn, key, specs: cst.BaseExpression, kind: str, scope: Scope
           ) -> list[tuple[str, cst.BaseExpression]] | str:
    specs = _local(fn, key, specs, scope)
    if isinstance(specs, (cst.List, cst.Tuple)):     # up to a ``*more`` (specs built elsewhere: their own)
        items = []
        for i, el in enumerate(specs.elements):
            if not isinstance(el, cst.Element):
                break
            items.append((f"{kind}[{i}]", _local(fn, key, el.value, scope)))
        return items
    if isinstance(specs, cst.Call) and N.callee(specs) == "BlockSpec":
        return [(kind, specs)]
    return f"`{kind}` is `{code(specs)}`, which discovery does not read as BlockSpecs"


def _block_shape(spec: cst.Call) -> cst.BaseExpression | None:
    given = [a.value for a in spec.args if a.keyword is not None and a.keyword.value == "block_shape"]
    if given:
        return given[0]
    positional = [a.value for a in spec.args if a.keyword is None]
    if positional and isinstance(positional[0], cst.Lambda):     # the older order: index map first
        positional = positional[1:]
    return positional[0] if positional else None


def operands(fn: cst.FunctionDef, key: str, call: cst.Call) -> list[cst.BaseExpression] | None:
    """The operands the pallas_call's kernel is applied to: ``pallas_call(...)(x, w)``, or
    ``f = pallas_call(...)`` then ``f(x, w)``."""
    bound = {var for var, bs in N.bindings(fn).items() if any(b.value is call and b.index is None for b in bs)}
    for outer in walk(fn):
        if isinstance(outer, cst.Call) and (outer.func is call or (isinstance(outer.func, cst.Name)
                                                                   and outer.func.value in bound)):
            return [a.value for a in outer.args]
    return None


def specs(tables: N.Tables, entry: str | None, scope: Callable[[str], Scope],
          task_out: Array | None) -> list[Spec]:
    """Every BlockSpec of every pallas_call reachable from ``entry``."""
    out: list[Spec] = []
    for key in sites(tables, entry):
        fn = tables.function(key)
        calls = [n for n in walk(fn) if is_pallas_call(n)]
        for nth, call in enumerate(calls):
            out += _call_specs(fn, key, call, nth, scope(key), task_out if len(calls) == 1 else None)
    return out


def _call_specs(fn, key, call, nth, scope: Scope, task_out: Array | None) -> list[Spec]:
    applied = operands(fn, key, call) or []
    prefetch = keyword(call, "num_scalar_prefetch")
    skip = scope.value(prefetch) if prefetch is not None else 0
    skip = skip if isinstance(skip, int) else 0
    declared = keyword(call, "out_shape")
    results: Any = scope.value(declared) if declared is not None else None
    out = []
    for kind in ("in_specs", "out_specs"):
        expr = keyword(call, kind)
        if expr is None:
            continue
        items = _items(fn, key, expr, kind, scope)
        if isinstance(items, str):
            out.append(Spec(key, call, nth, kind, expr, None, None, items))
            continue
        for i, (where, item) in enumerate(items):
            if kind == "in_specs":
                array = scope.value(applied[skip + i]) if skip + i < len(applied) else None
            elif isinstance(results, (tuple, list)):
                array = results[i] if i < len(results) and len(results) == len(items) else None
            else:
                array = results if isinstance(results, Array) else (task_out if len(items) == 1 else None)
            array = array if isinstance(array, Array) else None
            if isinstance(item, cst.Name) and item.value == "None":
                continue
            if not (isinstance(item, cst.Call) and N.callee(item) == "BlockSpec"):
                target = called(scope.tables, key, item) if isinstance(item, cst.Call) else None
                what = f"built by {target[0]}()" if target else "not a BlockSpec written in the module"
                text = " ".join(code(item).split())
                out.append(Spec(key, call, nth, where, item, None, array, f"`{text}` is {what}, "
                                                                         "which discovery does not read"))
                continue
            shape = _block_shape(item)
            if shape is not None and not (isinstance(shape, cst.Name) and shape.value == "None"):
                out.append(Spec(key, call, nth, where, item, shape, array))
    return out
