"""Accumulator: a reduction the kernel adds into its output block moves into an f32 VMEM scratch.

A kernel that zeroes its output block at the first step of the innermost grid axis and adds into it
at every step (``o_ref[...] += jnp.dot(...)``) accumulates in the output's dtype: in bf16, every
partial sum is rounded. This rewrite accumulates in an f32 scratch of the output block's shape and
stores once, at the last step::

    @pl.when(pl.program_id(2) == 0)             @pl.when(pl.program_id(2) == 0)
    def _init():                                def _init():
        o_ref[...] = jnp.zeros_like(o_ref)  ->      acc_ref[...] = jnp.zeros_like(acc_ref)
    o_ref[...] += jnp.dot(x, y)                 acc_ref[...] += jnp.dot(x, y)
                                                @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
                                                def _store_accumulator():
                                                    o_ref[...] = acc_ref[...].astype(o_ref.dtype)

What it proves first, and refuses otherwise (saying which): the kernel initialises its output at
``pl.program_id(R) == 0`` for R the grid's last axis; every output index map ignores R (so the block
stays in VMEM for R's whole pass: the scratch holds one block's sum, and the last step's store is
its only trip out); the output block's shape is a literal the scratch can take; the output is not
f32 already (accumulating in it then loses nothing, and the scratch would only cost VMEM).
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Rewrite
from .._walk import walk
from ..tuning.dimension_semantics import _keyword, _out_index_maps

STORE = "_store_accumulator"


def _out_ref(module: cst.Module, kernel: cst.FunctionDef) -> str:
    wrapper = C.wrapper(module)
    specs = _keyword(wrapper, "in_specs")
    if not isinstance(specs, (cst.List, cst.Tuple)):
        raise NotApplicable("in_specs is not a literal list: the output ref's place is not known")
    prefetch = _keyword(wrapper, "num_scalar_prefetch")
    skip = 0 if prefetch is None else (prefetch.evaluated_value if isinstance(prefetch, cst.Integer) else -1)
    if skip < 0:
        raise NotApplicable("num_scalar_prefetch is not a literal integer")
    params = kernel.params.params
    at = skip + len(specs.elements)
    if len(params) <= at:
        raise NotApplicable(f"the kernel {kernel.name.value}() does not name its output ref as parameter {at}")
    return params[at].name.value


def _init_axis(kernel: cst.FunctionDef, o_ref: str) -> int:
    """R of the ``@pl.when(pl.program_id(R) == 0)`` function that stores the output block."""
    found = set()
    for stmt in kernel.body.body:
        if not isinstance(stmt, cst.FunctionDef) or len(stmt.decorators) != 1:
            continue
        text = C.norm(stmt.decorators[0].decorator)
        stores = [n for n in walk(stmt.body) if isinstance(n, cst.AssignTarget)
                  and o_ref in C.names_in(n.target)]
        if text.startswith("pl.when(pl.program_id(") and text.endswith(")==0)") and stores:
            found.add(int(text[len("pl.when(pl.program_id("):-len(")==0)")]))
    if len(found) != 1:
        raise NotApplicable(f"the kernel does not initialise its output {o_ref} at pl.program_id(R) == 0 "
                            "for one axis R: no reduction in it to move")
    return found.pop()


class _Plan:
    def __init__(self, module: cst.Module, task: Any):
        if str(getattr(task, "output_dtype", "")) == "float32":
            raise NotApplicable("the output is f32 already: accumulating in it rounds nothing, and a scratch "
                                "would only cost VMEM")
        self.kernel = C.kernel(module)
        self.o_ref = _out_ref(module, self.kernel)
        if not any(_adds_into(n, self.o_ref) for n in walk(self.kernel.body)):
            raise NotApplicable(f"the kernel never adds into its output block {self.o_ref}: no reduction there")
        self.axis = _init_axis(self.kernel, self.o_ref)
        wrapper = C.wrapper(module)
        n = len(C.grid_tuple(wrapper).elements)
        if self.axis != n - 1:
            raise NotApplicable(f"the reduction axis {self.axis} is not the grid's last ({n - 1}): the output block "
                                "would leave VMEM between its steps")
        maps = _out_index_maps(module)
        if not maps:
            raise NotApplicable("the output index maps are not visible in the wrapper")
        for fn in maps:
            name = fn.params.params[self.axis].name.value if len(fn.params.params) > self.axis else None
            if name is None or name in C.names_in(fn.body):
                raise NotApplicable(f"an output index map follows the reduction axis {self.axis}: each of its steps "
                                    "writes another block")
        out = _keyword(wrapper, "out_specs")
        spec = out if isinstance(out, cst.Call) and C.is_call(out, "pl.BlockSpec") else None
        block = spec.args[0].value if spec is not None and spec.args and spec.args[0].keyword is None else None
        if not isinstance(block, cst.Tuple) or "None" in C.norm(block) or "Squeezed" in C.norm(block):
            raise NotApplicable("out_specs is not one pl.BlockSpec with a literal block shape (no squeezed "
                                "dimensions) the scratch can take")
        self.block = block
        scratch = _keyword(wrapper, "scratch_shapes")
        if scratch is not None and not isinstance(scratch, (cst.List, cst.Tuple)):
            raise NotApplicable("scratch_shapes is not a literal list")
        if _keyword(wrapper, "grid_spec") is not None:
            raise NotApplicable("the kernel's specs are in a grid_spec: not handled")
        self.scratch = scratch
        taken = C.names_in(self.kernel) | {p.name.value for p in self.kernel.params.params}
        self.acc = "acc_ref"
        while self.acc in taken:
            self.acc += "_"
        if STORE in taken:
            raise NotApplicable("the kernel already accumulates in a scratch")


def _adds_into(node: cst.CSTNode, ref: str) -> bool:
    """``ref[...] += v``, or ``ref[...] = <something reading ref>``."""
    if isinstance(node, cst.AugAssign):
        return ref in C.names_in(node.target)
    if isinstance(node, cst.Assign):
        return any(ref in C.names_in(t.target) for t in node.targets) and any(
            isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value == ref
            for n in walk(node.value))
    return False


class Accumulator(Rewrite):
    name = "accumulator"
    exact = False          # partial sums in f32 instead of the output's dtype
    description = ("Move a reduction the kernel adds into its output block (zeroed at the first step of the "
                   "innermost grid axis) into an f32 VMEM scratch, stored to the output once at the last step.")

    def _check(self, module, task) -> Applicability:
        _Plan(module, task)
        return APPLICABLE

    def _apply(self, module, task) -> cst.Module:
        p = _Plan(module, task)
        o, acc, r = p.o_ref, p.acc, p.axis

        def rename(n: cst.CSTNode) -> cst.CSTNode | None:
            if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == acc \
                    and n.attr.value == "dtype":
                return n.with_changes(value=cst.Name(o))        # casts keep meaning the output's dtype
            if isinstance(n, cst.Name) and n.value == o:
                return n.with_changes(value=acc)
            return None

        def uncast(n: cst.CSTNode) -> cst.CSTNode | None:
            # acc += part.astype(o_ref.dtype): the part goes into the f32 sum as it is
            if isinstance(n, cst.AugAssign) and acc in C.names_in(n.target):
                v = n.value
                if (isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value == "astype"
                        and len(v.args) == 1 and C.norm(v.args[0].value) == f"{o}.dtype"):
                    return n.with_changes(value=v.func.value)
            return None

        k = p.kernel
        body = C.transform(C.transform(k.body, rename), uncast)
        store = C.stmts(f"@pl.when(pl.program_id({r}) == pl.num_programs({r}) - 1)\n"
                        f"def {STORE}():\n    {o}[...] = {acc}[...].astype({o}.dtype)\n")
        store[0] = store[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        body = body.with_changes(body=[*body.body, *store])
        params_ = list(k.params.params)
        last = params_[-1]
        params_[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        params_.append(cst.Param(cst.Name(acc), comma=last.comma))
        k = k.with_changes(body=body, params=k.params.with_changes(params=params_))
        module = C.replace_function(module, k.name.value, k)
        vmem = f"pltpu.VMEM({C.code(p.block)}, jnp.float32)"
        call = C.pallas_call(module)
        scratch = C.call_kwarg(call, "scratch_shapes")
        if scratch is None:
            new_call = C.add_call_kwarg(call, "scratch_shapes", f"[{vmem}]")
        else:
            els = list(scratch.elements)  # type: ignore[attr-defined]
            if els:
                els[-1] = els[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            els.append(cst.Element(C.expr(vmem)))
            new_call = C.replace_node(call, scratch, scratch.with_changes(elements=els))
        module = C.replace_node(module, call, new_call)  # type: ignore[assignment]
        return C.with_import(module, C.PLTPU)
