"""Length skipping: no K/V DMA (and optionally no compute) for cache blocks past a sequence's length.

For a kernel whose task has per-sequence cache lengths (a scalar-prefetched ``lengths`` operand),
the K/V index maps clamp the kv grid index to the last block that holds a valid entry,
``min(j, (lengths[b] - 1) // block_kv)``: when the grid moves past it, the block index stops
changing and the pipeline issues no copy. The kernel's own mask (``cols < lengths[b]``, computed
from the unclamped grid index) keeps the re-used block out of the softmax, so the rewrite is
exact.

With ``compute=True`` the per-block compute is also wrapped in ``pl.when(kv * block_kv <
lengths[b])``. That branch depends on data: libtpu's static estimate cannot see it, so off a TPU
host the judge counts which way it went on the timing input and times static variants of the
kernel (evaluator/figure/trips.py); on a TPU host it is measured. The DMA half alone is seen by the
judge's HBM traffic model, which evaluates index maps on the real lengths (evaluator/figure/hbm_traffic.py).
"""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Operator

_LIVE = "_live_block"


def _kv_specs(module: cst.Module) -> list[tuple[cst.Call, int]]:
    """(BlockSpec, axis) pairs in the wrapper whose block is ``block_kv`` at ``axis`` and whose
    index map, ``lambda b, h, j, lengths: ...``, returns the kv grid index ``j`` there."""
    out = []
    for spec in C.iter_calls(C.wrapper(module), "pl.BlockSpec"):
        if len(spec.args) < 2 or not isinstance(spec.args[0].value, cst.Tuple):
            continue
        lam = spec.args[1].value
        if not isinstance(lam, cst.Lambda) or len(lam.params.params) != 4 \
                or not isinstance(lam.body, cst.Tuple):
            continue
        kv_param = lam.params.params[2].name.value
        shape = [C.norm(e.value) for e in spec.args[0].value.elements]
        index = [C.norm(e.value) for e in lam.body.elements]
        for axis, (dim, idx) in enumerate(zip(shape, index, strict=False)):
            if dim == "block_kv" and idx == kv_param:
                out.append((spec, axis))
    return out


def _clamped(module: cst.Module) -> bool:
    return any("jnp.minimum" in C.norm(s) and "lengths" in C.norm(s)
               for s in C.iter_calls(C.wrapper(module), "pl.BlockSpec"))


class LengthSkip(Operator):
    name = "length_skip"
    description = ("Per-sequence cache lengths: clamp the K/V index maps to each sequence's last valid "
                   "block (no DMA past it); optionally also skip the compute there (compute=True; a "
                   "data-dependent branch, timed on a TPU host only).")

    def _check(self, module, task) -> Applicability:
        if "lengths" not in getattr(task, "input_names", ()):
            return Applicability(False, "the task has no per-sequence cache lengths")
        fn = C.kernel(module)
        if "block_kv" not in C.kernel_kwonly(fn):
            return Applicability(False, "the kernel takes no block_kv keyword")
        if C.top_function(fn, _LIVE) is not None:
            return Applicability(False, "already skips blocks past each sequence's length")
        if not _clamped(module) and not _kv_specs(module):
            return Applicability(False, "no K/V BlockSpec (block_kv, lambda b, h, j, lengths: ...) "
                                        "returning the kv grid index")
        ids = C.program_id_names(fn)
        if 0 not in ids or 2 not in ids:
            return Applicability(False, "the kernel does not name program ids 0 (sequence) and 2 (kv block)")
        C.compute_span(fn)
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        if _clamped(module):
            return {"compute": True}
        return {"compute": rng.random() < 0.25}

    def _rewrite(self, module, task, params) -> cst.Module:
        compute = params.get("compute")
        if not isinstance(compute, bool):
            raise NotApplicable(f"compute={compute!r} must be true or false")
        if not _clamped(module):
            module = self._clamp(module)
        elif not compute:
            raise NotApplicable("the K/V index maps are already clamped to the lengths")
        if compute:
            module = self._skip_compute(module)
        return module

    def _clamp(self, module: cst.Module) -> cst.Module:
        for _ in range(len(_kv_specs(module))):
            spec, axis = _kv_specs(module)[0]
            lam = spec.args[1].value
            b, _h, j, lengths = (p.name.value for p in lam.params.params)
            elements = list(lam.body.elements)
            elements[axis] = elements[axis].with_changes(
                value=C.expr(f"jnp.minimum({j}, jax.lax.div({lengths}[{b}] - 1, block_kv))"))
            new_lam = lam.with_changes(body=lam.body.with_changes(elements=elements))
            new_spec = spec.with_changes(args=[spec.args[0], spec.args[1].with_changes(value=new_lam),
                                               *spec.args[2:]])
            module = C.replace_node(module, spec, new_spec)
        return module

    def _skip_compute(self, module: cst.Module) -> cst.Module:
        fn = C.kernel(module)
        ids = C.program_id_names(fn)
        lengths_ref = fn.params.params[0].name.value
        header = (f"@pl.when({ids[2]} * block_kv < {lengths_ref}[{ids[0]}])\n"
                  f"def {_LIVE}():\n    pass\n")

        def wrap(stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
            stmts = [stmts[0].with_changes(leading_lines=[]), *stmts[1:]] if stmts else stmts
            live = C.with_block(header, stmts)
            comment = cst.EmptyLine(comment=cst.Comment(
                "# Blocks past this sequence's length: no compute (their K/V index is clamped too)."))
            return [live.with_changes(leading_lines=[cst.EmptyLine(indent=False), comment])]

        fn = C.replace_compute(fn, wrap)
        return C.replace_function(module, fn.name.value, fn)
