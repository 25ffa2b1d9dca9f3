"""Split-KV (FlashDecoding's split): cut each sequence's cache into parts walked by separate programs.

The grid ``(batch, heads, kv blocks)`` becomes ``(batch, heads, kv_splits, kv blocks per split)``.
Each split runs the kernel's online softmax over its part and, instead of normalising, writes its
partial state: the unnormalised output, the running max and the running sum. A log-sum-exp
combine outside the kernel merges the splits (weights ``exp(m_split - m_max)``; a split entirely
past a sequence's length has a masked max and weight 0). The split axis is "parallel": on chips
with more than one TensorCore per chip the splits of one sequence can run side by side, which is
what helps a small batch. On one TensorCore (v5e, v6e) the work is the same plus the partials'
traffic and the combine; the judge measures which wins.

``KV_SPLITS`` is a module-level tunable (the task gives its legal values); the number of splits
used is ``gcd(KV_SPLITS, kv blocks)``, so block-size changes keep the kernel valid.
"""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Operator
from .._tunables import set_tunable

TUNABLE = "KV_SPLITS"
SPLITS = (2, 4, 8, 16)

_SPLITS = """\
kv_splits = math.gcd(KV_SPLITS, kv_len // block_kv)
kv_steps = kv_len // block_kv // kv_splits
"""
_SPLITS_COMMENT = ("# Split-KV: each sequence's cache in kv_splits parts, walked by separate programs; "
                   "each leaves", "# a partial state that the log-sum-exp combine below merges.")
_PART_SPECS = """\
part_spec = pl.BlockSpec((1, 1, 1, q_len, head_dim), lambda b, h, split, j, lengths: (b, h, split, 0, 0))
stats_spec = pl.BlockSpec((1, 1, 1, q_len, {stats}), lambda b, h, split, j, lengths: (b, h, split, 0, 0))
"""
_COMBINE = """\
# The log-sum-exp combine of the splits' partial states.
m_part, l_part = m_part[..., :1], l_part[..., :1]
weight = jnp.{exp}(m_part - jnp.max(m_part, axis=2, keepdims=True))
out = (jnp.sum(weight * acc_part, axis=2) / jnp.sum(weight * l_part, axis=2)).astype(q.dtype)
"""
_STORE = """\
o_ref[0, 0, 0] = {acc}[...]
m_out_ref[0, 0, 0] = {m}[...]
l_out_ref[0, 0, 0] = {l}[...]
"""


def _assignment(wrapper: cst.FunctionDef, name: str) -> tuple[int, cst.BaseExpression]:
    for i, stmt in enumerate(wrapper.body.body):
        pair = C.assigned_name(stmt)
        if pair and pair[0] == name:
            return i, pair[1]
    raise NotApplicable(f"the wrapper does not assign {name!r}")


def _invocation(ret: cst.Return) -> cst.Call:
    """``pl.pallas_call(...)(...)`` inside the wrapper's return value."""
    found = C.find_all(ret, lambda n: isinstance(n, cst.Call) and C.is_call(n.func, "pl.pallas_call"))
    if len(found) != 1:
        raise NotApplicable("the wrapper does not return one pl.pallas_call(...)(...) invocation")
    return found[0]  # type: ignore[return-value]


def _stats_lanes(wrapper: cst.FunctionDef) -> str:
    """The last dimension of the m scratch (the first ``pltpu.VMEM((rows, lanes), ...)``)."""
    calls = list(C.iter_calls(wrapper, "pltpu.VMEM"))
    if not calls or not calls[0].args or not isinstance(calls[0].args[0].value, cst.Tuple):
        raise NotApplicable("no pltpu.VMEM((rows, lanes), ...) scratch for the running max")
    return C.code(calls[0].args[0].value.elements[-1].value)


def _when_condition(fn: cst.FunctionDef, name: str) -> cst.Decorator:
    region = C.top_function(fn, name)
    if region is None:
        raise NotApplicable(f"the kernel has no @pl.when {name}")
    return next(d for d in region.decorators if C.is_call(d.decorator, "pl.when"))


class SplitKV(Operator):
    name = "split_kv"
    tunables = ("KV_SPLITS",)
    description = ("Split each sequence's KV cache into KV_SPLITS parts walked by separate programs (a "
                   "parallel grid axis), then merge their partial softmax states with a log-sum-exp combine.")

    def _check(self, module, task) -> Applicability:
        wrapper = C.wrapper(module)
        if "kv_splits" in C.names_in(wrapper):
            return Applicability(False, "the cache is already split")
        _, grid = _assignment(wrapper, "grid")
        if not isinstance(grid, cst.Tuple) or len(grid.elements) != 3:
            return Applicability(False, "the grid is not (batch, heads, kv blocks)")
        for name in ("block_kv", "kv_len", "q_len", "head_dim", "q"):
            if name not in C.names_in(wrapper):
                return Applicability(False, f"the wrapper does not name {name}")
        last = wrapper.body.body[-1]
        if not (isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)):
            return Applicability(False, "the wrapper does not end with a return")
        _invocation(last.body[0])
        fn = C.kernel(module)
        if len(fn.params.params) != 8:
            return Applicability(False, "the kernel's refs are not (lengths, q, k, v, o, m, l, acc)")
        ids = C.program_id_names(fn)
        if 2 not in ids:
            return Applicability(False, "the kernel does not name program id 2 (the kv block)")
        kv = ids[2]
        if C.norm(_when_condition(fn, "_init").decorator.args[0].value) != f"{kv}==0":
            return Applicability(False, f"_init does not run at {kv} == 0")
        if C.norm(_when_condition(fn, "_store").decorator.args[0].value) != f"{kv}==pl.num_programs(2)-1":
            return Applicability(False, f"_store does not run at the last {kv}")
        _stats_lanes(wrapper)
        if task.legal_values(TUNABLE) is None:
            return Applicability(False, f"the task gives no legal values for {TUNABLE}")
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        return {"splits": rng.choice(list(task.legal_values(TUNABLE)))}

    def _rewrite(self, module, task, params) -> cst.Module:
        splits = params.get("splits")
        if isinstance(splits, bool) or splits not in (task.legal_values(TUNABLE) or []):
            raise NotApplicable(f"splits={splits!r} is not legal: {task.legal_values(TUNABLE)}")
        module = self._kernel(module)
        module = self._wrapper(module)
        module = set_tunable(module, TUNABLE, str(splits))
        if not any(isinstance(s, cst.SimpleStatementLine) and C.norm(s) == "importmath" for s in module.body):
            body = list(module.body)
            at = next(i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
                      and isinstance(s.body[0], (cst.Import, cst.ImportFrom)))
            body.insert(at + 1, cst.parse_statement("import math\n"))
            module = module.with_changes(body=body)
        return module

    def _kernel(self, module: cst.Module) -> cst.Module:
        fn = C.kernel(module)
        names = [p.name.value for p in fn.params.params]
        m_name, l_name, acc_name = names[5:8]
        kv = C.program_id_names(fn)[2]
        params = list(fn.params.params)
        params[4:5] = [params[4], cst.Param(cst.Name("m_out_ref"), comma=params[4].comma),
                       cst.Param(cst.Name("l_out_ref"), comma=params[4].comma)]
        fn = fn.with_changes(params=fn.params.with_changes(params=params))

        def rewrite(node):
            pair = C.assigned_name(node)
            if pair and pair[0] == kv and C.norm(pair[1]) == "pl.program_id(2)":
                assign = node.body[0]
                return node.with_changes(body=[assign.with_changes(
                    value=C.expr("pl.program_id(2) * pl.num_programs(3) + pl.program_id(3)"))])
            return None

        fn = fn.with_changes(body=fn.body.with_changes(body=[C.transform(s, rewrite) for s in fn.body.body]))
        for region, condition, body in (("_init", "pl.program_id(3) == 0", None),
                                        ("_store", "pl.program_id(3) == pl.num_programs(3) - 1",
                                         _STORE.format(acc=acc_name, m=m_name, l=l_name))):
            old = C.top_function(fn, region)
            decorator = _when_condition(fn, region)
            new = old.with_changes(decorators=[
                d.with_changes(decorator=C.expr(f"pl.when({condition})")) if d is decorator else d
                for d in old.decorators])
            if body is not None:
                new = new.with_changes(body=new.body.with_changes(body=C.stmts(body)))
            fn = C.replace_top(fn, old, new)
        return C.replace_function(module, fn.name.value, fn)

    def _wrapper(self, module: cst.Module) -> cst.Module:
        wrapper = C.wrapper(module)
        fn = C.kernel(module)
        stats = _stats_lanes(wrapper)
        exp = "exp2" if C.find_all(fn, lambda n: C.is_call(n, "jnp.exp2")) else "exp"

        def rewrite(node):
            if isinstance(node, cst.Lambda) and len(node.params.params) == 4:
                g0, g1, g2, ref = (p.name.value for p in node.params.params)
                body = C.transform(node.body, lambda n: C.expr(f"(split * kv_steps + {g2})")
                                   if isinstance(n, cst.Name) and n.value == g2 else None)
                return C.expr(f"lambda {g0}, {g1}, split, {g2}, {ref}: {C.code(body)}")
            if isinstance(node, cst.Arg) and node.keyword is not None:
                key = node.keyword.value
                if key == "out_specs":
                    return node.with_changes(value=C.expr("[part_spec, stats_spec, stats_spec]"))
                if key == "out_shape":
                    return node.with_changes(value=C.expr(
                        "[jax.ShapeDtypeStruct((batch, heads, kv_splits, q_len, head_dim), jnp.float32), "
                        f"jax.ShapeDtypeStruct((batch, heads, kv_splits, q_len, {stats}), jnp.float32), "
                        f"jax.ShapeDtypeStruct((batch, heads, kv_splits, q_len, {stats}), jnp.float32)]"))
                if key == "dimension_semantics" and isinstance(node.value, cst.Tuple) \
                        and len(node.value.elements) == 3:
                    return node.with_changes(value=C.expr('("parallel", "parallel", "parallel", "arbitrary")'))
            return None

        body = [C.transform(s, rewrite) for s in wrapper.body.body]
        grid_at, _ = _assignment(wrapper, "grid")
        block_at, _ = _assignment(wrapper, "block_kv")
        body[grid_at] = cst.parse_statement("grid = (batch, heads, kv_splits, kv_steps)\n")
        splits = C.stmts(_SPLITS)
        splits[0] = splits[0].with_changes(leading_lines=[
            cst.EmptyLine(comment=cst.Comment(line)) for line in _SPLITS_COMMENT])
        ret_line = body[-1]
        ret = ret_line.body[0]
        call = _invocation(ret)
        combine = C.stmts(_COMBINE.format(exp=exp))
        combine[0] = combine[0].with_changes(leading_lines=[
            cst.EmptyLine(comment=cst.Comment(_COMBINE.splitlines()[0]))])
        returned = C.replace_node(ret, call, cst.Name("out"))
        tail = [cst.SimpleStatementLine([cst.Assign(
                    targets=[cst.AssignTarget(C.expr("acc_part, m_part, l_part"))], value=call)]),
                *combine, ret_line.with_changes(body=[returned])]
        specs = C.stmts(_PART_SPECS.format(stats=stats))
        body = body[:block_at + 1] + splits + body[block_at + 1:-1] + specs + tail
        return C.replace_wrapper(module, wrapper.with_changes(body=wrapper.body.with_changes(body=body)))
