"""Causal skipping: no work and no K/V DMA for kv blocks above the diagonal; mask only on it.

The kv block index in the K/V index maps is clamped to the last block row block ``i`` needs,
``((i + 1) * block_q - 1) // block_kv`` (as JAX's flash_attention does): when the grid moves on to
a skipped block the block index does not change, so the pipeline issues no copy. The compute is
wrapped in ``_step(needs_mask)``, run unmasked for blocks entirely below the diagonal and masked
for blocks that straddle it. The formulas hold for any BLOCK_Q / BLOCK_KV (both multiples of the
128 tile), so later block-size changes keep the kernel correct.
"""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Operator

_DISPATCH = """\
if causal:
    # Causal block skipping: kv blocks entirely above the diagonal do no work (their K/V
    # index is clamped in the index map, so no DMA either); only blocks that straddle the
    # diagonal pay for the mask.
    q_first = {qi} * block_q
    kv_first = {kvi} * block_kv
    kv_last = kv_first + block_kv - 1

    @pl.when(kv_last <= q_first)
    def _below_diagonal():
        _step(False)

    @pl.when(jnp.logical_and(kv_first < q_first + block_q, kv_last > q_first))
    def _on_diagonal():
        _step(True)
else:
    _step(False)
"""

_KV_INDEX_NAME = "kv_block_index"
_KV_INDEX = f"""\
def {_KV_INDEX_NAME}(i, j):
    # Causal: kv blocks past the diagonal map to the last block that q block i needs, so the
    # pipeline sees an unchanged block index and issues no DMA for them.
    if causal:
        return jnp.minimum(j, jax.lax.div((i + 1) * block_q - 1, block_kv))
    return j
"""


def _is_causal_if(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.If) and C.norm(node.test) == "causal"


def _kv_specs(module: cst.Module) -> list[cst.Call]:
    """The in_specs BlockSpecs whose index map returns the kv grid index at the sequence axis,
    whether listed one per operand or built per head (``tuple(pl.BlockSpec(...) for t in ...)``)."""
    in_specs = C.call_kwarg(C.pallas_call(module), "in_specs")
    if not isinstance(in_specs, (cst.List, cst.Tuple)):
        raise NotApplicable("pallas_call has no literal in_specs list")
    out = []
    for element in in_specs.elements:
        for spec in C.find_all(element.value, lambda n: C.is_call(n, "pl.BlockSpec")):
            if len(spec.args) < 2 or not isinstance(spec.args[1].value, cst.Lambda):
                continue
            lam = spec.args[1].value
            params = [p.name.value for p in lam.params.params]
            grid_params = [p for p in lam.params.params if p.default is None]
            if (len(grid_params) == 4 and isinstance(lam.body, cst.Tuple) and len(lam.body.elements) == 4
                    and C.norm(lam.body.elements[2].value) == params[3]):
                out.append(spec)
    return out


def _skips_already(module: cst.Module) -> str:
    """Where a site kernel function runs its compute under ``@pl.when(NAME)`` with NAME set under
    ``if causal:`` (JAX's ``should_run = below_or_on_diag(...)``), as 'pl.when(NAME) in FN'."""
    for fn in C.site_kernels(module):
        causal_names = {C.assigned_name(s)[0] for i in C.find_all(fn, _is_causal_if)
                        for s in i.body.body if C.assigned_name(s)}
        for d in C.find_all(fn, lambda n: isinstance(n, cst.Decorator) and C.is_call(n.decorator, "pl.when")):
            args = d.decorator.args
            if len(args) == 1 and isinstance(args[0].value, cst.Name) and args[0].value.value in causal_names:
                return f"pl.when({args[0].value.value}) in {fn.name.value}"
    return ""


class CausalSkip(Operator):
    name = "causal_skip"
    description = ("Causal only: skip kv blocks above the diagonal (pl.when), clamp their K/V block "
                   "index so no DMA is spent, and apply the mask only on diagonal blocks.")

    def _check(self, module, task) -> Applicability:
        if not getattr(task, "causal", False):   # a task without a causal mask has nothing to skip
            return Applicability(False, "the task is not causal")
        fn = C.kernel(module)
        if C.top_function(fn, "_step") is not None:
            return Applicability(False, "the kernel already dispatches its compute through _step")
        skipping = _skips_already(module)
        if skipping:
            return Applicability(False, f"the kernel already skips the blocks above the causal diagonal "
                                        f"({skipping}): nothing to add")
        C.compute_span(fn)
        ids = C.program_id_names(fn)
        if 2 not in ids or 3 not in ids:
            return Applicability(False, "kernel does not name pl.program_id(2) and pl.program_id(3)")
        kw = C.kernel_kwonly(fn)
        missing = [k for k in ("causal", "block_q", "block_kv") if k not in kw]
        if missing:
            return Applicability(False, f"kernel lacks keyword parameters {missing}")
        region = cst.Module(body=C.compute_statements(fn))
        if not C.find_all(region, _is_causal_if):
            return Applicability(False, "no 'if causal:' mask in the kernel's compute")
        wrapper_names = {C.assigned_name(s)[0] for s in C.wrapper(module).body.body if C.assigned_name(s)}
        if not {"block_q", "block_kv"} <= wrapper_names:
            return Applicability(False, "the wrapper does not define block_q and block_kv")
        if _KV_INDEX_NAME in C.names_in(C.wrapper(module)):
            return Applicability(False, f"the wrapper already defines {_KV_INDEX_NAME}")
        if len(_kv_specs(module)) != 2:
            return Applicability(False, "expected two K/V in_specs (or per-head spec groups) indexed by "
                                        "the kv grid axis")
        return APPLICABLE

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        return {}

    def _rewrite(self, module, task, params) -> cst.Module:
        fn = C.kernel(module)
        ids = C.program_id_names(fn)

        def unmask(node):
            if _is_causal_if(node):
                return node.with_changes(test=cst.Name("needs_mask"))
            return None

        start, stop = C.compute_span(fn)
        body = list(fn.body.body)
        compute = [C.transform(s, unmask) for s in body[start:stop]]
        compute[0] = compute[0].with_changes(
            leading_lines=[x for x in compute[0].leading_lines if x.comment is not None])
        step = C.with_block("def _step(needs_mask):\n    pass\n", compute)
        step = step.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        dispatch = C.stmts(_DISPATCH.format(qi=ids[2], kvi=ids[3]))[0]
        dispatch = dispatch.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        store = body[stop].with_changes(leading_lines=[cst.EmptyLine(indent=False), *body[stop].leading_lines])
        fn = fn.with_changes(body=fn.body.with_changes(
            body=body[:start] + [step, dispatch, store] + body[stop + 1:]))
        module = C.replace_function(module, fn.name.value, fn)
        # Clamp the K/V block index of skipped blocks to the last needed block.
        wrapper = C.wrapper(module)
        body = list(wrapper.body.body)
        at = next(k for k, stmt in enumerate(body) if C.find_all(stmt, lambda n: C.is_call(n, "pl.pallas_call")))
        helper = C.stmts(_KV_INDEX)[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(indent=False), *body[at].leading_lines])
        body.insert(at, helper)
        module = C.replace_wrapper(module,
                                    wrapper.with_changes(body=wrapper.body.with_changes(body=body)))
        for _ in range(2):
            spec = _kv_specs(module)[0]
            lam = spec.args[1].value
            i, j = (p.name.value for p in lam.params.params[2:4])
            elements = list(lam.body.elements)
            elements[2] = elements[2].with_changes(value=C.expr(f"{_KV_INDEX_NAME}({i}, {j})"))
            new_lam = lam.with_changes(body=lam.body.with_changes(elements=elements))
            new_spec = spec.with_changes(args=[spec.args[0], spec.args[1].with_changes(value=new_lam),
                                               *spec.args[2:]])
            module = C.replace_node(module, spec, new_spec)
        return module
