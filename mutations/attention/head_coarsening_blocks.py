"""Head coarsening on a kernel whose blocks carry a head axis (JAX's flash attention idiom).

JAX's forward kernel already blocks the batch: its BlockSpecs and scratch are ``(block_b, 1,
block, X)``, and the kernel handed to ``pallas_call`` loops ``for batch_idx in range(block_b):
kernel((batch_idx, 0), refs...)``, every ref then read as ``ref[batch_idx]``. The second index is
the head within the block, always 0. Heads per program is the same thing on the heads axis: the
grid's heads axis shrinks by ``heads_per_program``, the head dimension of every 4-D BlockSpec and
scratch buffer grows to it (the index maps already return the head *block* index), and the
dispatcher loops over the heads of its block, ``kernel((batch_idx, head_idx), ...)``.

The tunable is a literal in the wrapper, ``heads_per_program = P``, set again by a second
application; a call whose head count ``P`` does not divide runs one head per program.

A block of several heads is one contiguous slab of a ``(B, H, N, D)`` array only when its other
axes span the array (``block_q`` and ``block_k_major`` equal to the sequence, Autocomp's 2048-wide
blocks on its workload); otherwise it is a strided DMA, which libtpu 0.0.42.1's static estimate
classifies as REMOTE and gives 0 cycles, so the judge refuses it (FAIL_TIMING). The rewrite applies
only where the task's sequence is spanned by the blocks the source sets.
"""

from __future__ import annotations

import libcst as cst

from ..tuning import block_fields as F
from .. import _cst as C
from .. import _sites
from .._base import NotApplicable

HPP = "heads_per_program"
HEAD_IDX = "head_idx"

_SETTING = """\
{hpp} = {value}  # heads per program (head_coarsening)
if {heads} % {hpp}:
    {hpp} = 1  # a head count it does not divide: one head per program
"""


def _grid(wrapper: cst.FunctionDef) -> tuple[cst.SimpleStatementLine, cst.Tuple]:
    for stmt in wrapper.body.body:
        pair = C.assigned_name(stmt)
        if pair and pair[0] == "grid" and isinstance(pair[1], cst.Tuple) and len(pair[1].elements) == 4:
            return stmt, pair[1]  # type: ignore[return-value]
    raise NotApplicable("the wrapper has no 'grid = (batch, heads, q blocks, kv blocks)'")


def _one_head_shapes(wrapper: cst.FunctionDef) -> list[cst.Tuple]:
    """The 4-D block and scratch shapes with a head dimension of 1."""
    out = []
    for call in C.find_all(wrapper, lambda n: C.is_call(n, "pl.BlockSpec") or C.is_call(n, "pltpu.VMEM")):
        shape = call.args[0].value if call.args else None  # type: ignore[attr-defined]
        if isinstance(shape, cst.Tuple) and len(shape.elements) == 4 and C.norm(shape.elements[1].value) == "1":
            out.append(shape)
    return out


def _dispatch(fn: cst.FunctionDef) -> tuple[cst.For, cst.Call]:
    """``for b in range(block_b): kernel((b, 0), <first ref>, ...)`` in the kernel handed to
    pallas_call."""
    first = fn.params.params[0].name.value if fn.params.params else None
    for stmt in fn.body.body:
        if not (isinstance(stmt, cst.For) and isinstance(stmt.target, cst.Name)
                and C.is_call(stmt.iter, "range") and len(stmt.body.body) == 1):
            continue
        line = stmt.body.body[0]
        call = line.body[0].value if (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
                                      and isinstance(line.body[0], cst.Expr)) else None
        if (isinstance(call, cst.Call) and len(call.args) >= 2
                and C.norm(call.args[0].value) == f"({stmt.target.value},0)"
                and C.norm(call.args[1].value) == first):
            return stmt, call
    raise NotApplicable(f"{fn.name.value} does not run 'for b in range(block_b): kernel((b, 0), "
                        f"{first or 'refs'}, ...)'")


def current(module: cst.Module) -> int | None:
    """The heads per program already set in the site's wrapper."""
    for stmt in C.wrapper(module).body.body:
        pair = C.assigned_name(stmt)
        if pair and pair[0] == HPP and isinstance(pair[1], cst.Integer):
            return int(pair[1].evaluated_value)
    return None


def _spans(module: cst.Module, task) -> None:
    """Raise NotApplicable unless the blocks span the sequence (a contiguous slab of heads)."""
    n = getattr(task, "seq_len", None)
    entry, _ = _sites.current()
    fields = F.fields(module, entry)
    for name in ("block_q", "block_k_major"):
        value = fields[name].value if name in fields else None
        if n is None or value != n:
            raise NotApplicable(f"{name}={value} does not span the sequence (N={n}): a block of several "
                                "heads would be a strided DMA, which libtpu 0.0.42.1's static estimate "
                                "times at 0 cycles (the judge refuses it); move the blocks to N first")


def check(module: cst.Module, task) -> None:
    """Raise NotApplicable unless the site has this idiom (or already has the tunable) and its
    blocks span the task's sequence."""
    structure(module)
    _spans(module, task)


def has_idiom(module: cst.Module) -> bool:
    try:
        structure(module)
    except NotApplicable:
        return False
    return True


def structure(module: cst.Module) -> None:
    """Raise NotApplicable unless the site already has the tunable, or its blocks carry a head
    axis of 1 and its kernel dispatches over the batch block."""
    if current(module) is not None:
        return
    wrapper = C.wrapper(module)
    _, grid = _grid(wrapper)
    if not isinstance(grid.elements[1].value, cst.Name):
        raise NotApplicable("the grid's head axis is not a plain name")
    if HPP in C.names_in(wrapper):
        raise NotApplicable(f"the wrapper already uses the name {HPP!r}")
    shapes = _one_head_shapes(wrapper)
    if not shapes:
        raise NotApplicable("no (block_b, 1, block, X) BlockSpec with a head dimension of 1")
    fn = C.kernel(module)
    if HEAD_IDX in C.names_in(fn):
        raise NotApplicable(f"the kernel already uses the name {HEAD_IDX!r}")
    _dispatch(fn)


def rewrite(module: cst.Module, hpp: int) -> cst.Module:
    if current(module) is not None:
        wrapper = C.wrapper(module)
        line = next(s for s in wrapper.body.body if (C.assigned_name(s) or ("",))[0] == HPP)
        new_line = line.with_changes(body=[line.body[0].with_changes(value=cst.Integer(str(hpp)))])
        return C.replace_wrapper(module, C.replace_node(wrapper, line, new_line))  # type: ignore[arg-type]
    # The kernel: loop over the heads of the block.
    fn = C.kernel(module)
    loop, call = _dispatch(fn)
    first = C.code(call.args[1].value)
    batch = loop.target.value  # type: ignore[attr-defined]
    inner_call = call.with_changes(args=[call.args[0].with_changes(value=C.expr(f"({batch}, {HEAD_IDX})")),
                                         *call.args[1:]])
    inner = C.with_block(f"for {HEAD_IDX} in range({first}.shape[1]):  # the heads of the block\n    pass\n",
                         [C.replace_node(loop.body.body[0], call, inner_call)])
    new_loop = loop.with_changes(body=loop.body.with_changes(body=[inner]))
    module = C.replace_function(module, fn.name.value, C.replace_node(fn, loop, new_loop))  # type: ignore[arg-type]
    # The wrapper: the setting, the grid's heads axis, the head dimension of blocks and scratch.
    wrapper = C.wrapper(module)
    grid_line, grid = _grid(wrapper)
    heads = C.code(grid.elements[1].value)
    elements = list(grid.elements)
    elements[1] = elements[1].with_changes(value=C.expr(f"{heads} // {HPP}"))
    new_grid_line = C.replace_node(grid_line, grid, grid.with_changes(elements=elements))
    setting = C.stmts(_SETTING.format(hpp=HPP, value=hpp, heads=heads))
    setting[0] = setting[0].with_changes(leading_lines=grid_line.leading_lines)
    new_grid_line = new_grid_line.with_changes(leading_lines=[])
    body = []
    for stmt in wrapper.body.body:
        body.extend([*setting, new_grid_line] if stmt is grid_line else [stmt])
    wrapper = wrapper.with_changes(body=wrapper.body.with_changes(body=body))
    ids = {id(s) for s in _one_head_shapes(wrapper)}

    class Widen(cst.CSTTransformer):
        def leave_Tuple(self, original, updated):
            if id(original) in ids:
                els = list(updated.elements)
                els[1] = els[1].with_changes(value=cst.Name(HPP))
                return updated.with_changes(elements=els)
            return updated

    return C.replace_wrapper(module, wrapper.visit(Widen()))
