"""Head coarsening: each program handles HEADS_PER_PROGRAM heads (a static loop over heads)."""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from . import _cst as C
from ._base import APPLICABLE, Applicability, NotApplicable, Operator
from ._block_sizes import MAX_HEADS_PER_PROGRAM
from ._tunables import module_ints, set_tunable

HEAD = "head"

_WRAPPER_CHECK = """\
heads_per_program = HEADS_PER_PROGRAM
if {heads} % heads_per_program:
    raise ValueError(f"{{{heads}}} heads is not a multiple of HEADS_PER_PROGRAM={{heads_per_program}}")
"""


def _choices(task: Any) -> list[int]:
    return [d for d in range(2, min(task.heads, MAX_HEADS_PER_PROGRAM) + 1) if task.heads % d == 0]


def _grid_assign(wrapper: cst.FunctionDef) -> tuple[int, cst.Tuple]:
    for i, stmt in enumerate(wrapper.body.body):
        pair = C.assigned_name(stmt)
        if pair and pair[0] == "grid" and isinstance(pair[1], cst.Tuple) and len(pair[1].elements) == 4:
            return i, pair[1]
    raise NotApplicable("the wrapper has no 'grid = (batch, heads, q blocks, kv blocks)'")


def _per_head(node: cst.CSTNode, io_refs: list[str], scratch_refs: list[str]) -> cst.CSTNode:
    """``io[0, 0]`` -> ``io[0, head]``; ``scratch[...]`` -> ``scratch[head]``."""

    def rewrite(n):
        if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name):
            index = "".join(C.code(cst.Subscript(value=cst.Name("x"), slice=n.slice)).split())
            if n.value.value in io_refs and index == "x[0,0]":
                elements = list(n.slice)
                elements[1] = elements[1].with_changes(slice=cst.Index(cst.Name(HEAD)))
                return n.with_changes(slice=elements)
            if n.value.value in scratch_refs and index == "x[...]":
                return n.with_changes(slice=[cst.SubscriptElement(cst.Index(cst.Name(HEAD)))])
        return None

    return C.transform(node, rewrite)


class HeadCoarsening(Operator):
    name = "head_coarsening"
    description = ("Process HEADS_PER_PROGRAM heads per program: block specs grow along heads, the "
                   "grid's head axis shrinks, scratch gains a head axis, the body loops over heads.")

    def _check(self, module, task) -> Applicability:
        if "HEADS_PER_PROGRAM" in module_ints(module):
            return Applicability(False, "the kernel already has HEADS_PER_PROGRAM (use block_sizes)")
        if not _choices(task):
            return Applicability(False, f"H={task.heads} has no divisor in 2..{MAX_HEADS_PER_PROGRAM}")
        fn = C.kernel(module)
        io_refs, scratch_refs = C.kernel_refs(fn)
        if HEAD in C.names_in(fn):
            return Applicability(False, f"the kernel already uses the name {HEAD!r}")
        region = cst.Module(body=C.compute_statements(fn))
        probe = _per_head(region, io_refs, scratch_refs)
        if C.code(probe).count(f"[0, {HEAD}]") < 3:
            return Applicability(False, "the compute does not read q/k/v as ref[0, 0] (one head per program)")
        _, grid = _grid_assign(C.wrapper(module))
        if not isinstance(grid.elements[1].value, cst.Name):
            return Applicability(False, "the grid's head axis is not a plain name")
        for call in C.scratch_vmem_calls(module):
            if len(call.args[0].value.elements) != 2:  # type: ignore[attr-defined]
                return Applicability(False, "scratch buffers are not 2-D (BQ, X)")
        specs = list(C.iter_calls(C.pallas_call(module), "pl.BlockSpec"))
        if len(specs) != 4 or not all(
                isinstance(s.args[0].value, cst.Tuple) and len(s.args[0].value.elements) == 4
                and C.norm(s.args[0].value.elements[1].value) == "1" for s in specs):
            return Applicability(False, "expected four BlockSpecs of shape (1, 1, block, head_dim)")
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        return {"heads_per_program": rng.choice(_choices(task))}

    def _rewrite(self, module, task, params) -> cst.Module:
        hpp = params.get("heads_per_program")
        if hpp not in _choices(task):
            raise NotApplicable(f"heads_per_program={hpp!r} is not one of {_choices(task)} for H={task.heads}")
        fn = C.kernel(module)
        io_refs, scratch_refs = C.kernel_refs(fn)

        # Kernel: loop over heads in the compute and in the store.
        def loop(statements):
            statements = [_per_head(s, io_refs, scratch_refs) for s in statements]
            lead = [x for x in statements[0].leading_lines if x.comment is not None]
            statements[0] = statements[0].with_changes(leading_lines=lead)
            head = C.with_block(f"for {HEAD} in range(heads_per_program):\n    pass\n", statements)
            return [head]

        fn = C.replace_compute(fn, loop)
        if C.top_function(fn, "_step") is None:
            start, _ = C.compute_span(fn)
            body = list(fn.body.body)
            body[start] = body[start].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
            fn = fn.with_changes(body=fn.body.with_changes(body=body))
        store = C.store_function(fn)
        new_store = store.with_changes(body=store.body.with_changes(body=loop(list(store.body.body))))
        fn = C.replace_top(fn, store, new_store)
        fn = C.add_kwonly_param(fn, "heads_per_program")
        module = C.replace_function(module, fn.name.value, fn)

        # Wrapper: the tunable, the check, the grid, the block specs, the scratch, the partial.
        module = set_tunable(module, "HEADS_PER_PROGRAM", str(hpp))
        wrapper = C.wrapper(module)
        index, grid = _grid_assign(wrapper)
        heads = C.code(grid.elements[1].value)
        elements = list(grid.elements)
        elements[1] = elements[1].with_changes(value=C.expr(f"{heads} // heads_per_program"))
        body = list(wrapper.body.body)
        grid_line = body[index]
        new_grid_line = grid_line.with_changes(body=[grid_line.body[0].with_changes(  # type: ignore
            value=grid.with_changes(elements=elements))])
        body[index:index + 1] = C.stmts(_WRAPPER_CHECK.format(heads=heads)) + [new_grid_line]
        wrapper = wrapper.with_changes(body=wrapper.body.with_changes(body=body))

        def widen(n):
            if C.is_call(n, "pl.BlockSpec") and isinstance(n.args[0].value, cst.Tuple):
                shape = n.args[0].value
                els = list(shape.elements)
                if len(els) == 4 and C.norm(els[1].value) == "1":
                    els[1] = els[1].with_changes(value=cst.Name("heads_per_program"))
                    return n.with_changes(args=[n.args[0].with_changes(value=shape.with_changes(
                        elements=els)), *n.args[1:]])
            if C.is_call(n, "pltpu.VMEM") and isinstance(n.args[0].value, cst.Tuple):
                shape = n.args[0].value
                if len(shape.elements) == 2:
                    els = [cst.Element(cst.Name("heads_per_program"),
                                       comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                           *shape.elements]
                    return n.with_changes(args=[n.args[0].with_changes(value=shape.with_changes(
                        elements=els)), *n.args[1:]])
            if C.is_call(n, "functools.partial") and C.norm(n.args[0].value) == kernel_name:
                return C.add_call_kwarg(n, "heads_per_program", "heads_per_program")
            return None

        kernel_name = fn.name.value
        wrapper = wrapper.with_changes(body=C.transform(wrapper.body, widen))
        return C.replace_function(module, C.WRAPPER_NAME, wrapper)
