"""Split-KV across chips: the cache split along its length over the task's mesh (``--chips 4``).

The kernel becomes the *per-chip* program of the seed contract (``CHIPS = <chips>``): the judge's
harness hands each chip its share of the cache and its own cache lengths (the task's
``chip_split``), the kernel walks that share as before (split-KV within the chip included: a plain
kernel is first given ``KV_SPLITS = 1``), and the partial states (unnormalised output, running max,
running sum) are merged across the chips by a log-sum-exp combine over the mesh axis. How the
combine talks across the mesh is the operator's parameter (``COMBINE``):

* ``gather``: one ``all_gather`` of every chip's packed (acc, m, l), then each chip combines all of
  them itself (one collective's fixed latency; 4x the bytes of a reduction, a few KB at decode);
* ``packed``: a ``pmax`` of the maxima, then one ``psum`` of the weighted (acc, l) packed together;
* ``separate``: a ``pmax``, then one ``psum`` for acc and one for l.

A chip past a sequence's end holds no entry of it: its max is the mask value or -inf and its weight
0 (its within-chip combine is guarded against -inf - -inf). Applied to a kernel already split over
the chips, the operator changes ``COMBINE`` only. The judge times every combine by the ICI model.
"""

from __future__ import annotations

import random
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Operator
from .split_kv import SplitKV
from .._tunables import module_ints, set_tunable

COMBINES = ("gather", "packed", "separate")

_ACROSS = '''\
def _across_chips(acc, top, sums, exp):
    """The log-sum-exp combine over the chips of this chip's partial state: acc (B, H, T, D), its
    running max and sum (B, H, T, 1)."""
    if COMBINE == "gather":     # one all-gather of the packed partials; each chip combines them all
        every = jax.lax.all_gather(jnp.concatenate([acc, top, sums], axis=-1), CHIP_AXIS)
        acc, top, sums = every[..., :-2], every[..., -2:-1], every[..., -1:]
        weight = exp(top - jnp.max(top, axis=0))
        return jnp.sum(weight * acc, axis=0) / jnp.sum(weight * sums, axis=0)
    weight = exp(top - jax.lax.pmax(top, CHIP_AXIS))
    if COMBINE == "packed":     # one psum of the weighted partials, the sum packed beside acc
        total = jax.lax.psum(jnp.concatenate([weight * acc, weight * sums], axis=-1), CHIP_AXIS)
        return total[..., :-1] / total[..., -1:]
    return jax.lax.psum(weight * acc, CHIP_AXIS) / jax.lax.psum(weight * sums, CHIP_AXIS)
'''
_COMBINE = """\
m_chip = jnp.max(m_part, axis=2, keepdims=True)
weight = jnp.{exp}(m_part - jnp.where(jnp.isfinite(m_chip), m_chip, 0.0))
out = _across_chips(jnp.sum(weight * acc_part, axis=2), m_chip[:, :, 0], jnp.sum(weight * l_part, axis=2),
                    jnp.{exp}).astype(q.dtype)
"""


def _combine_lines(wrapper: cst.FunctionDef) -> tuple[int, int, str]:
    """The indices of split-KV's ``weight = jnp.exp...(...)`` and ``out = ...`` statements, and the
    exponential it uses."""
    weight = out = None
    for i, stmt in enumerate(wrapper.body.body):
        pair = C.assigned_name(stmt)
        if pair and pair[0] == "weight" and weight is None:
            weight = i
        elif pair and pair[0] == "out" and weight is not None and out is None:
            out = i
    if weight is None or out is None:
        raise NotApplicable("the wrapper has no split-KV combine (weight = ..., out = ...)")
    text = C.code(wrapper.body.body[weight])
    exp = "exp2" if "jnp.exp2(" in text else "exp"
    if f"jnp.{exp}(" not in text or "_across_chips" in C.code(wrapper.body.body[out]):
        raise NotApplicable("the wrapper's combine is not split-KV's")
    return weight, out, exp


def _string_constant(module: cst.Module, name: str) -> str | None:
    for stmt in module.body:
        pair = C.assigned_name(stmt)
        if pair and pair[0] == name and isinstance(pair[1], cst.SimpleString):
            return pair[1].evaluated_value
    return None


class ChipSplit(Operator):
    name = "chip_split"
    description = ("Split the KV cache along its length over the task's chips (--chips 4: a v5e 2x2) and "
                   "merge the chips' partial softmax states with a log-sum-exp combine over the mesh "
                   "(COMBINE: one all-gather, or pmax then one psum, or pmax then two psums).")

    def _check(self, module, task) -> Applicability:
        chips = getattr(task, "chips", 1)
        if chips < 2:
            return Applicability(False, "the task has one chip (a task with a mesh: --chips 4)")
        if "CHIPS" in module_ints(module):
            if _string_constant(module, "COMBINE") not in COMBINES:
                return Applicability(False, "the kernel sets CHIPS but no COMBINE this operator knows")
            return APPLICABLE
        wrapper = C.wrapper(module)
        if "kv_splits" in C.names_in(wrapper):
            _combine_lines(wrapper)
            return APPLICABLE
        return SplitKV().check(module.code, task)

    def _sample(self, module, task, rng: random.Random) -> dict[str, Any]:
        current = _string_constant(module, "COMBINE")
        return {"combine": rng.choice([c for c in COMBINES if c != current])}

    def _rewrite(self, module, task, params) -> cst.Module:
        combine = params.get("combine")
        if combine not in COMBINES or set(params) != {"combine"}:
            raise NotApplicable(f"chip_split takes combine in {COMBINES}, got {params}")
        if "CHIPS" in module_ints(module):
            return set_tunable(module, "COMBINE", f'"{combine}"')
        if "kv_splits" not in C.names_in(C.wrapper(module)):
            module = SplitKV()._rewrite(module, task, {"splits": 1})
        wrapper = C.wrapper(module)
        weight, out, exp = _combine_lines(wrapper)
        body = list(wrapper.body.body)
        body[weight:out + 1] = C.stmts(_COMBINE.format(exp=exp))
        module = C.replace_wrapper(module, wrapper.with_changes(body=wrapper.body.with_changes(body=body)))
        module = set_tunable(module, "CHIPS", str(task.chips),
                             comment="the per-chip program of a mesh: each chip holds a share of the cache")
        module = set_tunable(module, "COMBINE", f'"{combine}"')
        module = set_tunable(module, "CHIP_AXIS", f'"{task.mesh_axis}"')
        at = module.body.index(C.wrapper(module))
        helper = cst.parse_module(_ACROSS).body[0].with_changes(
            leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        return module.with_changes(body=[*module.body[:at], helper, *module.body[at:]])
