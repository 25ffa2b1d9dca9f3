"""Copies in need: a DMA issued for a slot past the end with a dummy index is not issued at all.

A kernel that copies a variable number of pages into a fixed-size buffer often keeps its DMA count
static by copying a dummy page into the slots past the end. JAX's ragged paged attention does it in
``MultiPageAsyncCopyDescriptor`` (its own TODO: "Only fetch dynamic shape in need!"):

    for i in range(vmem_buf.shape[0]):
      page_idx = start_page_idx + i
      page_idx = jax.lax.select(page_idx < end_page_idx, page_idx, 0)
      self._async_copies.append(pltpu.make_async_copy(...page_idx..., vmem_buf.at[i], sem))
    ...
    for async_copy in self._async_copies:
      async_copy.start()            # and .wait() elsewhere

The rewrite records the condition beside each copy (``self._async_copies_needed``, appended before
the index is clamped) and starts and waits each copy under ``pl.when`` of it. The slots not copied
keep what the buffer held; the kernel must mask them (RPA masks K and V past each sequence's
length with a select, which also stops a NaN there). Starts and waits see the same condition when
the descriptors that start and wait a block are built from the same metadata (RPA's are); the judge
checks the outputs on secret inputs, and the copies' bytes are counted as they ran on the timing
input (evaluator/figure/dmas.py), so the bytes saved show in the HBM floor.

Each guarded start and wait is a branch on data: off a TPU host the judge counts it on the timing
input and holds a branch that issues a DMA at its most-taken arm (evaluator/figure/trips.py).
"""

from __future__ import annotations

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, Rewrite

_SELECTS = ("jax.lax.select", "lax.select", "jnp.where")
_NEEDED = "_needed"


def _clamp(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """``X = select(COND, X, dummy)``: (X, COND)."""
    pair = C.assigned_name(stmt)
    if pair is None or not isinstance(pair[1], cst.Call):
        return None
    call = pair[1]
    if C.norm(call.func) not in _SELECTS or len(call.args) != 3 or C.norm(call.args[1].value) != pair[0]:
        return None
    return pair[0], call.args[0].value


def _append_target(stmt: cst.CSTNode) -> str | None:
    """``LIST.append(pltpu.make_async_copy(...))``: LIST (its code)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.Call)):
        return None
    call = stmt.body[0].value
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "append" and len(call.args) == 1):
        return None
    inner = call.args[0].value
    if not (isinstance(inner, cst.Call) and C.norm(inner.func).endswith("make_async_copy")):
        return None
    return C.norm(call.func.value)


def _builders(module: cst.Module) -> list[tuple[cst.For, int, str, cst.BaseExpression, str]]:
    """The loops that append clamped copies: (loop, index of the clamp, X, COND, LIST)."""
    out = []
    for loop in C.find_all(module, lambda n: isinstance(n, cst.For)):
        body = list(loop.body.body)
        for i, stmt in enumerate(body):
            clamp = _clamp(stmt)
            if clamp is None:
                continue
            name, cond = clamp
            targets = [t for s in body[i + 1:] if (t := _append_target(s)) is not None]
            if len(targets) == 1 and name in C.names_in(cond):
                out.append((loop, i, name, cond, targets[0]))
    return out


def _issuers(module: cst.Module, target: str) -> list[cst.For]:
    """``for C in LIST: C.start()`` / ``C.wait()`` loops (one statement each)."""
    out = []
    for loop in C.find_all(module, lambda n: isinstance(n, cst.For)):
        if C.norm(loop.iter) != target or not isinstance(loop.target, cst.Name) or len(loop.body.body) != 1:
            continue
        text = C.norm(loop.body.body[0])
        var = loop.target.value
        if text in (f"{var}.start()", f"{var}.wait()"):
            out.append(loop)
    return out


class CopiesInNeed(Rewrite):
    name = "copies_in_need"
    description = ("DMAs that copy a dummy page into the slots past the end (an index clamped by "
                   "select) are started and waited only where needed (pl.when of the clamp's "
                   "condition): JAX's ragged paged attention's own 'only fetch in need' TODO.")

    def _check(self, module, task) -> Applicability:
        builders = _builders(module)
        if not builders:
            return Applicability(False, "no loop appending pltpu.make_async_copy(...) of an index clamped "
                                        "by select(cond, index, dummy)")
        if all(f"{target}{_NEEDED}.append(" in C.code(loop) for loop, *_, target in builders):
            return Applicability(False, "the copies are already issued only where needed")
        if not any(_issuers(module, target) for *_, target in builders):
            return Applicability(False, "no 'for c in <copies>: c.start()' or c.wait() loop to guard")
        return APPLICABLE

    def _apply(self, module, task) -> cst.Module:
        for loop, i, _name, cond, target in _builders(module):
            needed = target + _NEEDED
            body = list(loop.body.body)
            record = C.stmts(f"{needed}.append({C.code(cond)})\n")[0]
            new_loop = loop.with_changes(body=loop.body.with_changes(body=[*body[:i], record, *body[i:]]))
            init = C.stmts(f"{needed} = []\n")[0]
            module = _replace_statement(module, loop, [init, new_loop])
            while issuers := _issuers(module, target):     # a replaced loop no longer matches
                issuer = issuers[0]
                var = issuer.target.value
                method = C.norm(issuer.body.body[0]).split(".")[-1].removesuffix("()")
                guarded = C.stmts(f"for {var}_needed, {var} in zip({needed}, {target}):\n"
                                  f"    pl.when({var}_needed)({var}.{method})\n")[0]
                module = _replace_statement(module, issuer, [guarded])
        return module


def _replace_statement(module: cst.Module, old: cst.CSTNode, new: list[cst.BaseStatement]) -> cst.Module:
    """``old`` (a statement in some block) replaced by the statements ``new``."""

    class T(cst.CSTTransformer):
        def on_leave(self, original, updated):
            if original is old:
                return cst.FlattenSentinel(new)
            return updated

    return module.visit(T())


__all__ = ["CopiesInNeed"]
