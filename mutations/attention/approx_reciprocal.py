"""Approximate reciprocal for the final softmax normalisation: in ``_store``, ``acc / l`` ->
``acc * pl.reciprocal(l, approx=True)``, where ``l`` is the l scratch. It applies once the
normalisation is deferred to ``_store`` (deferred_norm); the per-step normalisation of the seed is
left alone (deferred_norm removes it, and the search finds that order).

On a TPU this is the EUP's approximate reciprocal instead of a divide on the VPU. Off a TPU, JAX
lowers the approximate reciprocal through bfloat16 (about 2^-9 relative error), so the judge's
interpret-mode correctness check sees an error at least as large as the chip's; whether the
task's tolerance holds is the judge's call, per dtype.
"""

from __future__ import annotations

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Rewrite


def _divisions(fn: cst.FunctionDef) -> list[cst.BinaryOperation]:
    """Divisions by the l scratch (alone, maybe indexed by the head) in ``_store``."""
    _, (_, l_ref, _) = C.kernel_refs(fn)
    store = C.top_function(fn, "_store")
    if store is None:
        return []
    return [n for n in C.find_all(store, lambda n: isinstance(n, cst.BinaryOperation)
                                  and isinstance(n.operator, cst.Divide))
            if l_ref in C.names_in(n.right) and not C.names_in(n.right) - {l_ref, "head"}]


class ApproxReciprocal(Rewrite):
    name = "approx_reciprocal"
    exact = False
    description = ("Normalise by the softmax sum with pl.reciprocal(l, approx=True) (the EUP's "
                   "approximate reciprocal) instead of an exact divide; the judge checks the tolerance.")

    def _check(self, module, task) -> Applicability:
        try:
            return self._check_seed(module)
        except NotApplicable as exc:
            if self._production(module):
                return APPLICABLE
            raise exc

    def _check_seed(self, module) -> Applicability:
        fn = C.kernel(module)
        if C.find_all(fn, lambda n: C.is_call(n, "pl.reciprocal")):
            raise NotApplicable("the kernel already uses pl.reciprocal")
        if not _divisions(fn):
            raise NotApplicable("no division by the softmax sum (l) in _store: defer the "
                                "normalisation first (deferred_norm)")
        return APPLICABLE

    def _production(self, module) -> bool:
        """A production kernel's per-step reciprocal of the softmax sum (JAX's idiom)."""
        try:
            return bool(production_sites(module))
        except NotApplicable:
            return False

    def _apply(self, module, task) -> cst.Module:
        try:
            self._check_seed(module)
        except NotApplicable:
            if self._production(module):
                return rewrite_production(module)
            raise
        fn = C.kernel(module)
        targets = {C.norm(d) for d in _divisions(fn)}

        def rewrite(node):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide) \
                    and C.norm(node) in targets:
                recip = C.expr(f"pl.reciprocal({C.code(node.right)}, approx=True)")
                return node.with_changes(operator=cst.Multiply(), right=recip)
            return None

        return C.replace_function(module, fn.name.value, C.transform(fn, rewrite))


# ---- production kernels ------------------------------------------------------------------------
# JAX's flash attention normalises at every kv step by ``jnp.where(l_next == 0.0, 1.0, 1.0 /
# l_next)``. An approximate reciprocal there compounds over the kv steps: on JAX's kernel at
# B=1,H=2,N=256 the judge failed it on a tempered secret draw (99th-percentile error 0.00895, over
# 1.5x the reference's), so that inverse is left alone, as the seed's per-step one is. What is
# rewritten is a normalisation done once: the store's ``acc / jnp.where(l == 0.0, 1.0, l)`` after
# deferred_norm, and the single-step body's ``p /= l`` (l the softmax sum, from jnp.sum).
def _guarded_inverse(node: cst.CSTNode) -> bool:
    """``jnp.where(L == 0.0, 1.0, 1.0 / L)`` (deferred_norm's production match reads it)."""
    if not (C.is_call(node, "jnp.where") and len(node.args) == 3):  # type: ignore[attr-defined]
        return False
    cond, one, inv = (a.value for a in node.args)  # type: ignore[attr-defined]
    return (isinstance(inv, cst.BinaryOperation) and isinstance(inv.operator, cst.Divide)
            and _is_one(inv.left) and _is_one(one) and isinstance(cond, cst.Comparison)
            and C.norm(cond.left) == C.norm(inv.right))


def _is_one(node: cst.CSTNode) -> bool:
    return C.norm(node) in ("1", "1.0")


def _guarded_division(node: cst.CSTNode) -> bool:
    """``X / jnp.where(L == 0.0, 1.0, L)``: the deferred store."""
    if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide)
            and C.is_call(node.right, "jnp.where") and len(node.right.args) == 3):  # type: ignore[attr-defined]
        return False
    cond, one, value = (a.value for a in node.right.args)  # type: ignore[attr-defined]
    return (_is_one(one) and isinstance(cond, cst.Comparison)
            and C.norm(cond.left) == C.norm(value))


def _sum_division(node: cst.CSTNode, sums: set[str]) -> bool:
    """``X /= L`` with L the softmax sum (assigned from jnp.sum)."""
    return (isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign)
            and isinstance(node.value, cst.Name) and node.value.value in sums)


def production_sites(module: cst.Module) -> list[cst.FunctionDef]:
    """The site's kernel functions that normalise once: a guarded division or ``p /= l``."""
    out = []
    for fn in C.site_kernels(module):
        sums = C.assigned_from(fn, ("jnp.sum(",))
        if C.find_all(fn, lambda n, sums=sums: _guarded_division(n) or _sum_division(n, sums)):
            out.append(fn)
    return out


def rewrite_production(module: cst.Module) -> cst.Module:
    for fn in production_sites(module):
        sums = C.assigned_from(fn, ("jnp.sum(",))

        def rewrite(node, sums=sums):
            if _guarded_division(node):
                recip = C.expr(f"pl.reciprocal({C.code(node.right)}, approx=True)")
                return node.with_changes(operator=cst.Multiply(), right=recip)
            if _sum_division(node, sums):
                return node.with_changes(operator=cst.MultiplyAssign(),
                                         value=C.expr(f"pl.reciprocal({node.value.value}, approx=True)"))
            return None

        fn = C.module_function(module, fn.name.value)
        module = C.replace_function(module, fn.name.value, C.transform(fn, rewrite))
    return module
