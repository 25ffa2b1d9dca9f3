"""Compact scratch: running max / sum from (BQ, 128) lane-replicated to (BQ, 1) buffers."""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, Operator

_LANE_SLICE = ":,:1"


def _is_lane_slice(node: cst.CSTNode) -> bool:
    return (isinstance(node, cst.Subscript)
            and "".join(C.code(cst.Subscript(value=cst.Name("x"), slice=node.slice)).split())
            == "x[" + _LANE_SLICE + "]")


class CompactScratch(Operator):
    name = "compact_scratch"
    description = ("Shrink the running max / sum scratch from (..., BQ, 128) to (..., BQ, 1) and drop "
                   "the [:, :1] slices that only undid the lane replication.")

    def _check(self, module, task) -> Applicability:
        C.kernel(module)
        calls = C.scratch_vmem_calls(module)
        if C.stats_compact(module):
            return Applicability(False, "the m / l scratch are already (BQ, 1)")
        for call in calls[:2]:
            last = call.args[0].value.elements[-1].value  # type: ignore[attr-defined]
            if C.norm(last) not in ("STATS_LANES", "128"):
                return Applicability(False, f"m / l scratch last dimension is {C.code(last)!r}, "
                                            "expected STATS_LANES or 128")
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        return {}

    def _rewrite(self, module, task, params) -> cst.Module:
        for which in range(2):
            call = C.scratch_vmem_calls(module)[which]
            shape = call.args[0].value
            elements = list(shape.elements)  # type: ignore[attr-defined]
            elements[-1] = elements[-1].with_changes(value=cst.Integer("1"))
            new_call = call.with_changes(
                args=[call.args[0].with_changes(value=shape.with_changes(elements=elements)),
                      *call.args[1:]])
            module = C.replace_node(module, call, new_call)  # type: ignore[assignment]
        fn = C.kernel(module)

        def drop_slice(node):
            if _is_lane_slice(node):
                inner = node.value
                # Keep parentheses only when the inner expression needs them on its own line.
                if isinstance(inner, (cst.Name, cst.Subscript, cst.Call, cst.Attribute)):
                    return inner.with_changes(lpar=[], rpar=[])
                return inner
            return None

        new_fn = C.transform(fn, drop_slice)
        return C.replace_function(module, fn.name.value, new_fn)
