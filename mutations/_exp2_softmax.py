"""exp2 softmax: fold log2(e) into the logit scale and use exp2 (one VPU multiply less per logit)."""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from . import _cst as C
from ._base import APPLICABLE, Applicability, NotApplicable, Operator

LOG2_E = "1.4426950408889634"


def _is_scale(node: cst.CSTNode) -> bool:
    """``X = X * sm_scale`` (the logit scaling)."""
    pair = C.assigned_name(node)
    if pair is None or not isinstance(pair[1], cst.BinaryOperation):
        return False
    value = pair[1]
    return (isinstance(value.operator, cst.Multiply) and C.norm(value.right) == "sm_scale"
            and C.norm(value.left) == pair[0])


class Exp2Softmax(Operator):
    name = "exp2_softmax"
    description = ("Scale logits by sm_scale * log2(e) and use jnp.exp2 for every exponential of the "
                   "online softmax (same result, one multiply less per logit).")

    def _regions(self, fn: cst.FunctionDef) -> cst.Module:
        return cst.Module(body=C.compute_statements(fn))

    def _check(self, module, task) -> Applicability:
        fn = C.kernel(module)
        region = self._regions(fn)
        if C.find_all(fn, lambda n: C.is_call(n, "jnp.exp2")):
            return Applicability(False, "the kernel already uses jnp.exp2")
        if "kv_splits" in C.names_in(C.wrapper(module)):
            return Applicability(False, "split-KV's combine already reads the kernel's maxima in natural-log units")
        if len(C.find_all(region, _is_scale)) != 1:
            return Applicability(False, "no single 's = s * sm_scale' logit scaling in the compute")
        if not C.find_all(region, lambda n: C.is_call(n, "jnp.exp")):
            return Applicability(False, "no jnp.exp in the compute")
        if C.find_all(fn, lambda n: isinstance(n, cst.Attribute) and C.norm(n) in ("jnp.log", "jax.nn.softmax")):
            return Applicability(False, "the kernel uses natural-log quantities elsewhere")
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        return {}

    def _rewrite(self, module, task, params) -> cst.Module:
        if params:
            raise NotApplicable(f"exp2_softmax takes no parameters, got {params}")
        fn = C.kernel(module)

        def rewrite(node):
            if _is_scale(node):
                line = node
                assign = line.body[0]
                value = assign.value.with_changes(right=C.expr(f"(sm_scale * {LOG2_E})"))
                comment = cst.EmptyLine(comment=cst.Comment(
                    "# Logits in base 2: exp2(x * log2(e)) == exp(x), one multiply less per logit."))
                return line.with_changes(body=[assign.with_changes(value=value)],
                                         leading_lines=[*line.leading_lines, comment])
            if C.is_call(node, "jnp.exp"):
                return node.with_changes(func=C.expr("jnp.exp2"))
            return None

        new_fn = C.replace_compute(fn, lambda stmts: [C.transform(s, rewrite) for s in stmts])
        return C.replace_function(module, fn.name.value, new_fn)
