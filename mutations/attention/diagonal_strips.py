"""Diagonal strips: a causal block on the diagonal is computed as row strips that skip what lies
above the diagonal inside the block.

After ``causal_skip`` a block that straddles the diagonal still computes all of its
``BLOCK_Q x BLOCK_KV`` logits and masks half of them away. With square blocks, the rows
``[a*S, (a+1)*S)`` of a diagonal block see only the kv columns ``[0, (a+1)*S)``: the strip
version runs ``_step`` once per strip on ref views (``ref.at[...]``) of those rows and columns,
so a diagonal block costs ``(n+1)/2n`` of the full block (``n = BLOCK_Q / S``), with one
online-softmax update per strip. This is the wavefront (triangular) tiling of the diagonal; it
is what lets large blocks pay off under a causal mask (JAX's kernel computes the whole block).

The rewrite is generic over the rest of ``_step`` (deferred normalisation, exp2, compact
statistics and head coarsening's per-head ref tuples all keep working on views), adds the
tunable ``DIAGONAL_STRIP`` (S), and guards itself at trace time: blocks that are not square,
or that S does not split, run ``_step(True)`` as before, so later block-size changes keep the
kernel correct.
"""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from .. import _cst as C
from . import diagonal_strips_loop as loop_idiom
from .._base import APPLICABLE, Applicability, NotApplicable, Operator
from .._tunables import module_ints, set_tunable

TUNABLE = "DIAGONAL_STRIP"
STRIPS = (128, 256, 512, 1024)
_STRIPS_FN = "_diagonal_strips"

_STRIPS = """\
def {fn}(strip):
    # Rows [a*strip, (a+1)*strip) of a diagonal block see kv columns [0, (a+1)*strip) only.
    for a in range(block_q // strip):
        rows = pl.ds(a * strip, strip)
        seen = pl.ds(0, (a + 1) * strip)
        _step(True, row0=a * strip,
              {views})
"""

_ON_DIAGONAL = """\
if block_q == block_kv and block_q % {tunable} == 0 and block_q > {tunable}:
    {fn}({tunable})
else:
    _step(True)
"""


def _on_diagonal(fn: cst.FunctionDef) -> cst.FunctionDef | None:
    found = C.find_all(fn, lambda n: isinstance(n, cst.FunctionDef) and n.name.value == "_on_diagonal")
    return found[0] if len(found) == 1 else None  # type: ignore[return-value]


def _rows_assign(step: cst.FunctionDef) -> list[cst.CSTNode]:
    """``rows = <q block start> + iota(..., 0)``: the mask's row ids inside ``_step``."""
    return C.find_all(step, lambda n: isinstance(n, cst.Assign) and len(n.targets) == 1
                      and C.norm(n.targets[0].target) == "rows"
                      and "broadcasted_iota" in C.code(n.value) and "block_q" in C.code(n.value))


class DiagonalStrips(Operator):
    name = "diagonal_strips"
    tunables = ("DIAGONAL_STRIP",)
    knob = True
    chain_rank = 3           # after the blocks: a strip divides the block it strips
    description = ("Causal, after causal_skip: compute a diagonal block as row strips of "
                   "DIAGONAL_STRIP rows, each seeing only the kv columns up to the diagonal "
                   "(the masked triangle above it is never computed).")

    def _check(self, module, task) -> Applicability:
        if not getattr(task, "causal", False):   # a task without a causal mask has nothing to skip
            return Applicability(False, "the task is not causal")
        if TUNABLE in module_ints(module):
            return APPLICABLE   # a knob from here on: another strip height
        seed = self._check_seed(module)
        if seed.ok:
            return seed
        # JAX's idiom: a loop over kv sub-blocks inside a block (see _diagonal_strips_loop).
        if loop_idiom.current(module) is not None:
            return APPLICABLE
        try:
            loop_idiom.find(module)
        except NotApplicable as exc:
            return Applicability(False, f"{seed.reason}; {exc}")
        return APPLICABLE

    def _check_seed(self, module) -> Applicability:
        """The seed's idiom: _step(needs_mask) run by an _on_diagonal block (after causal_skip)."""
        try:
            fn = C.kernel(module)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        step = C.top_function(fn, "_step")
        if step is None or [p.name.value for p in step.params.params] != ["needs_mask"]:
            return Applicability(False, "no _step(needs_mask) to strip (apply causal_skip first)")
        on_diag = _on_diagonal(fn)
        if on_diag is None or C.norm(cst.Module(body=list(on_diag.body.body))) != "_step(True)":
            return Applicability(False, "no _on_diagonal block that runs _step(True)")
        if len(_rows_assign(step)) != 1:
            return Applicability(False, "no single 'rows = ... block_q ... iota' mask row ids in _step")
        if {"row0", "strip", "seen", _STRIPS_FN} & C.names_in(fn):
            return Applicability(False, "the kernel already uses one of the names row0/strip/seen")
        try:
            C.kernel_refs(fn)   # q, k, v, o and three scratch refs
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return APPLICABLE

    def grid_settings(self, source: str, task: Any, tried: list[Any], best: Any | None
                      ) -> list[tuple[Any, ...]]:
        """No strips, or each strip height tried, lowest first."""
        heights = {edit.params["strip"]: edit for edit in tried}
        return [()] + [(heights[h],) for h in sorted(heights)]

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        current = module_ints(module).get(TUNABLE)
        if current is None and not self._check_seed(module).ok:
            current = loop_idiom.current(module)
        return {"strip": rng.choice([s for s in STRIPS if s != current])}

    def _rewrite(self, module, task, params) -> cst.Module:
        strip = params.get("strip")
        if strip not in STRIPS:
            raise NotApplicable(f"strip={strip!r} is not one of {STRIPS}")
        if TUNABLE in module_ints(module):
            return set_tunable(module, TUNABLE, str(strip))
        if not self._check_seed(module).ok:
            return loop_idiom.rewrite(module, strip)
        fn = C.kernel(module)
        io_refs, scratch_refs = C.kernel_refs(fn)
        inputs, outs = io_refs[:3], scratch_refs
        # _step takes ref views (defaulting to the whole refs) and the strip's first row.
        step = C.top_function(fn, "_step")
        defaults = ", ".join(f"{r}={r}" for r in inputs + outs)
        header = C.with_block(f"def _step(needs_mask, row0=0, *, {defaults}):\n    pass\n", [])
        rows = _rows_assign(step)[0]
        new_rows = rows.with_changes(value=C.expr(f"row0 + {C.code(rows.value)}"))
        new_step = C.replace_node(step, rows, new_rows)
        new_step = new_step.with_changes(params=header.params)
        coarse = "HEADS_PER_PROGRAM" in module_ints(module)   # per-head ref tuples, 3-D scratch

        def view(ref: str) -> str:
            if ref in outs:
                return f"{ref}={ref}.at[{':, ' if coarse else ''}rows, :]"
            sl = "rows" if ref == inputs[0] else "seen"
            return (f"{ref}=tuple(t.at[:, :, {sl}, :] for t in {ref})" if coarse
                    else f"{ref}={ref}.at[:, :, {sl}, :]")

        views = ",\n              ".join(view(r) for r in inputs + outs)
        strips_fn = C.stmts(_STRIPS.format(fn=_STRIPS_FN, views=views))[0].with_changes(
            leading_lines=[cst.EmptyLine(indent=False)])
        body = []
        for stmt in fn.body.body:
            if stmt is step:
                body.extend([new_step, strips_fn])
            else:
                body.append(stmt)
        fn = fn.with_changes(body=fn.body.with_changes(body=body))
        on_diag = _on_diagonal(fn)
        guard = C.stmts(_ON_DIAGONAL.format(fn=_STRIPS_FN, tunable=TUNABLE))
        fn = C.replace_node(fn, on_diag, on_diag.with_changes(body=on_diag.body.with_changes(body=guard)))
        module = C.replace_function(module, fn.name.value, fn)
        return set_tunable(module, TUNABLE, str(strip),
                           comment="rows per strip of a causal diagonal block (diagonal_strips)")
