"""Grid order: swap two axes of the kernel's grid, with every index map and program id.

The pipeline walks the grid in order, last axis fastest; an input block whose index does not
change from one step to the next is not fetched again. Which axes are outer decides which operand
stays resident (for a matmul over (i, j, k) with the whole K in one block, the LHS row block stays
while j moves). Swapping axes a and b is three edits that keep the same set of steps:

* the ``grid=(...)`` tuple's elements a and b;
* every index map's parameters a and b (``lambda i, j, k: (i, k)`` -> ``lambda j, i, k: (i, k)``:
  the body is unchanged, the names now arrive in the new order);
* ``pl.program_id(a)`` <-> ``pl.program_id(b)`` (and ``pl.num_programs``) in the kernel and every
  function it calls, and the two entries of ``dimension_semantics``.

Only the order of the steps changes, so it is correct exactly when no state crosses a or b: what
``dimension_semantics`` proves before it makes an axis parallel (the kernel does not branch on the
axis's program id, any scratch is scoped by an arbitrary axis inside both, and every output index
map uses both, so each step writes its own block). The operator refuses every other pair, saying
why; the judge checks the rest on secret inputs.
"""

from __future__ import annotations

import ast
import random
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Operator
from ..tuning.dimension_semantics import SEMANTICS, _out_index_maps, _semantics, why_not_parallel

ID_CALLS = ("pl.program_id", "pl.num_programs")


def _names(module: cst.Module, n: int) -> list[str]:
    """The axes' semantics: from the kernel's CompilerParams, else all arbitrary (the default)."""
    try:
        _, names = _semantics(module)
    except NotApplicable:
        return ["arbitrary"] * n
    if len(names) != n:
        raise NotApplicable(f"dimension_semantics names {len(names)} axes of a {n}-axis grid")
    return names


def _index_maps(wrapper: cst.FunctionDef, n: int) -> list[cst.Lambda]:
    """Every index map of the wrapper's BlockSpecs, each a lambda taking the n grid indices (and,
    with scalar prefetch, the prefetched refs after them)."""
    maps = []
    for call in C.iter_calls(wrapper, "pl.BlockSpec"):
        given = [a for a in call.args if a.keyword is None][1:2] or [
            a for a in call.args if a.keyword is not None and a.keyword.value == "index_map"]
        if not given:
            continue
        fn = given[0].value
        if not isinstance(fn, cst.Lambda):
            raise NotApplicable(f"an index map is not a lambda ({C.code(fn)}): its parameters cannot be reordered")
        if fn.params.star_arg not in (cst.MaybeSentinel.DEFAULT,) or len(fn.params.params) < n:
            raise NotApplicable(f"the index map {C.code(fn)} does not name the {n} grid indices")
        maps.append(fn)
    specs = [C.call_kwarg(call, kw) for call in C.iter_calls(wrapper, "pl.pallas_call")
             for kw in ("in_specs", "out_specs")]
    if not maps and any(s is not None for s in specs):
        raise NotApplicable("no BlockSpec index map is visible in the wrapper")
    return maps


def _ids(fns: list[cst.FunctionDef]) -> list[cst.Call]:
    calls = [c for fn in fns for name in ID_CALLS for c in C.iter_calls(fn, name)]
    for call in calls:
        arg = call.args[0].value if call.args else None
        if not isinstance(arg, cst.Integer):
            raise NotApplicable(f"the kernel calls {C.code(call)}: an axis that is not a literal cannot be followed")
    return calls


def _pairs(module: cst.Module) -> tuple[list[tuple[int, int]], str]:
    """The pairs of axes that may swap, and why the others may not."""
    n = len(C.grid_tuple(C.wrapper(module)).elements)
    if n < 2:
        raise NotApplicable(f"the grid has {n} axis: nothing to reorder")
    names = _names(module, n)
    why = {a: why_not_parallel(module, a, names) for a in range(n)}
    free = [a for a in range(n) if why[a] is None]
    legal = [(a, b) for i, a in enumerate(free) for b in free[i + 1:]]
    reasons = "; ".join(f"axis {a}: {w}" for a, w in why.items() if w)
    # The order decides what stays resident only where an input's block follows one axis and not
    # the other (a matmul's LHS ignores j, its RHS i); where every input uses both, no fetch changes.
    wrapper = C.wrapper(module)
    outs = {id(fn) for fn in _out_index_maps(module)}
    inputs = [fn for fn in _index_maps(wrapper, n) if id(fn) not in outs]

    def follows(fn: cst.Lambda, axis: int) -> bool:
        return fn.params.params[axis].name.value in C.names_in(fn.body)

    pairs = [(a, b) for a, b in legal if any(follows(fn, a) != follows(fn, b) for fn in inputs)]
    if legal and not pairs:
        reasons = (f"every input's block follows both or neither of the axes that may swap "
                   f"({', '.join(f'{a} and {b}' for a, b in legal)}): the order changes no fetch")
    return pairs, reasons


def _swap(node: cst.CSTNode, a: int, b: int) -> Any:
    """``pl.program_id(a)`` <-> ``pl.program_id(b)`` (and ``pl.num_programs``) under ``node``."""
    def fn(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Call) and any(C.is_call(n, name) for name in ID_CALLS):
            arg = n.args[0].value
            if isinstance(arg, cst.Integer) and arg.evaluated_value in (a, b):
                new = arg.with_changes(value=str(b if arg.evaluated_value == a else a))
                return n.with_changes(args=[n.args[0].with_changes(value=new), *n.args[1:]])
        return None
    return C.transform(node, fn)


def _axis_names(module: cst.Module) -> list[str]:
    """The grid's axes by the names the wrapper's first index map gives them."""
    wrapper = C.wrapper(module)
    n = len(C.grid_tuple(wrapper).elements)
    maps = _index_maps(wrapper, n)
    if not maps:
        raise NotApplicable("no index map names the grid's axes")
    return [p.name.value for p in maps[0].params.params[:n]]


class GridOrder(Operator):
    name = "grid_order"
    description = ("Swap two axes of the kernel's grid, with every index map's parameters, program id and "
                   "dimension semantics, where no state crosses either axis: which operand stays resident "
                   "while the inner axes move.")

    def _check(self, module, task) -> Applicability:
        wrapper = C.wrapper(module)
        n = len(C.grid_tuple(wrapper).elements)
        _index_maps(wrapper, n)
        _ids(C.site_kernels(module))
        pairs, reasons = _pairs(module)
        if not pairs:
            return Applicability(False, f"no two grid axes are free to swap: {reasons}")
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        a, b = rng.choice(_pairs(module)[0])
        names = _axis_names(module)
        return {"outer": names[b], "inner": names[a]}

    def _rewrite(self, module, task, params) -> cst.Module:
        # The axes are named by the first index map's parameters, which move with them: an edit
        # says which axis goes before which, so it replays and does not apply twice.
        names = _axis_names(module)
        outer, inner = params.get("outer"), params.get("inner")
        if outer not in names or inner not in names or outer == inner:
            raise NotApplicable(f"outer={outer!r}, inner={inner!r} must be two of the grid's axes {names}")
        a, b = names.index(outer), names.index(inner)
        if a < b:
            raise NotApplicable(f"axis {outer} is already outside axis {inner}")
        a, b = b, a
        pairs, reasons = _pairs(module)
        if (a, b) not in pairs:
            raise NotApplicable(f"axes {a} ({inner}) and {b} ({outer}) may not swap ({reasons})")
        wrapper = C.wrapper(module)
        grid = C.grid_tuple(wrapper)
        n = len(grid.elements)
        replace: dict[cst.CSTNode, cst.CSTNode] = {}
        elements = list(grid.elements)
        elements[a], elements[b] = (elements[b].with_changes(comma=elements[a].comma),
                                    elements[a].with_changes(comma=elements[b].comma))
        replace[grid] = grid.with_changes(elements=elements)
        for fn in _index_maps(wrapper, n):
            ps = list(fn.params.params)
            ps[a], ps[b] = ps[b].with_changes(comma=ps[a].comma), ps[a].with_changes(comma=ps[b].comma)
            replace[fn] = fn.with_changes(params=fn.params.with_changes(params=ps))
        value = None
        try:
            value, names = _semantics(module)
        except NotApplicable:
            pass
        if value is not None:
            els = list(value.elements)
            els[a], els[b] = els[b].with_changes(comma=els[a].comma), els[a].with_changes(comma=els[b].comma)
            replace[value] = value.with_changes(elements=els)
            assert all(ast.literal_eval(e.value.value) in SEMANTICS for e in els)  # type: ignore[attr-defined]
        new_wrapper = wrapper.visit(_Replace(replace))
        module = C.replace_wrapper(module, new_wrapper)
        for fn in C.site_kernels(module):
            module = C.replace_function(module, fn.name.value, _swap(fn, a, b))
        return module


class _Replace(cst.CSTTransformer):
    def __init__(self, table: dict[cst.CSTNode, cst.CSTNode]):
        super().__init__()
        self.table = table

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        return self.table.get(original_node, updated_node)
