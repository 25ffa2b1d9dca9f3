"""Grouped heads (GQA): one program per K/V head, its ``group`` query heads stacked as rows.

Where several query heads share a K/V head (H a multiple of H_KV), a kernel with one program per
query head reads each K/V block once per query head. This rewrite reshapes q, outside the
kernel, from (B, H, T, D) to (B, H_KV, group * T, D) (a free reshape: the heads sharing a K/V
head are adjacent), runs the same kernel over H_KV "heads" of group * T query rows each, and
reshapes the output back. The kernel itself is unchanged: its rows were already independent.
The K/V traffic drops by the group factor.
"""

from __future__ import annotations

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Rewrite

_GROUPING = """\
# Grouped heads: the query heads sharing a K/V head become one program's rows, so each K/V
# block is read once per K/V head instead of once per query head.
in_shape = q.shape
q = q.reshape(batch, kv_heads, group * q_len, head_dim)
heads, q_len, group = kv_heads, group * q_len, 1
"""


def _group_statement(wrapper: cst.FunctionDef) -> int:
    for i, stmt in enumerate(wrapper.body.body):
        pair = C.assigned_name(stmt)
        if pair and pair[0] == "group" and C.norm(pair[1]) == "heads//kv_heads":
            return i
    raise NotApplicable("the wrapper has no 'group = heads // kv_heads'")


class GroupedHeads(Rewrite):
    name = "grouped_heads"
    description = ("GQA: one program per K/V head with its query heads stacked as rows (q reshaped "
                   "outside the kernel), so each K/V block is read once per group, not once per head.")

    def _check(self, module, task) -> Applicability:
        heads, kv_heads = getattr(task, "heads", None), getattr(task, "kv_heads", None)
        if not heads or not kv_heads or heads == kv_heads:
            return Applicability(False, f"the task has no grouped query heads (H={heads}, HKV={kv_heads})")
        wrapper = C.wrapper(module)
        if "in_shape" in C.names_in(wrapper):
            return Applicability(False, "the heads are already grouped")
        _group_statement(wrapper)
        names = C.names_in(wrapper)
        missing = [n for n in ("batch", "kv_heads", "q_len", "head_dim", "q") if n not in names]
        if missing:
            return Applicability(False, f"the wrapper does not name {', '.join(missing)}")
        last = wrapper.body.body[-1]
        if not (isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)):
            return Applicability(False, "the wrapper does not end with 'return pl.pallas_call(...)(...)'")
        return APPLICABLE

    def _apply(self, module, task) -> cst.Module:
        wrapper = C.wrapper(module)
        body = list(wrapper.body.body)
        at = _group_statement(wrapper) + 1
        grouping = C.stmts(_GROUPING)
        grouping[0] = grouping[0].with_changes(leading_lines=[
            cst.EmptyLine(comment=cst.Comment(line.strip()))
            for line in _GROUPING.splitlines()[:2]])
        ret = body[-1].body[0]
        new_ret = ret.with_changes(value=cst.Call(
            func=cst.Attribute(value=ret.value, attr=cst.Name("reshape")),
            args=[cst.Arg(cst.Name("in_shape"))]))
        body[-1] = body[-1].with_changes(body=[new_ret])
        body = body[:at] + grouping + body[at:]
        return C.replace_wrapper(module, wrapper.with_changes(body=wrapper.body.with_changes(body=body)))
