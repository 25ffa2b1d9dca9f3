"""Fuse a reduction: a sum or mean taken of the kernel's output becomes partial sums the kernel writes.

A Huber loss written as an elementwise kernel with ``jnp.mean`` in the wrapper writes the whole loss
array to HBM for XLA to read back and add up: two trips of an array the size of the inputs, for one
number. This rewrite has the kernel add up each block it would have stored and write that block's
partial sums instead (one (8, 128) f32 tile, 4 KiB, per output block); the wrapper adds the tiles up::

    out = pl.pallas_call(kernel, ...,                 _pre = jax.ShapeDtypeStruct((m, n), p.dtype)
        out_specs=pl.BlockSpec(block, index),   ->    _partial_shape, _partial_spec = _reduction_partials(
        out_shape=jax.ShapeDtypeStruct(                   _pre, pl.BlockSpec(block, index))
            (m, n), p.dtype))(p, t)                   out = pl.pallas_call(
    return jnp.mean(out)                                  functools.partial(kernel, pre_dtype=_pre.dtype), ...,
                                                          out_specs=_partial_spec,
                                                          out_shape=_partial_shape)(p, t)
                                                      return _reduction_total(out, _pre, mean=True)

and in the kernel each whole store ``o_ref[...] = v`` becomes
``o_ref[...] = _reduction_block_partial(v, pre_dtype)``: ``v`` rounded to the output's dtype, as it
was stored, then added up in f32 as 8 x 128 tiles (the VPU's adds: no lane reduction) when the
block's last two dimensions are multiples of (8, 128), else its total at [0, 0] of the tile.

The partial tile of an output block sits at that block's index (the output's own index map, two
zeros appended): it is written exactly where and when the output block was, whatever the grid's
order and its axes' semantics. A cell of a "parallel" axis writes its own tile, and an output block
that an "arbitrary" axis revisits (a reduction's last step stores it) is revisited the same way.
The mean divides by the output's element count, taken from its ``out_shape``.

The reduction is ``jnp.sum(out)`` or ``jnp.mean(out)`` (whole: no ``axis``) or ``out.sum()`` /
``out.mean()`` of the pallas_call's output, in the function that makes it or in the one caller of
that function, the output used nowhere else (``jnp.sum(out) / n`` keeps its ``/ n``). The kernel
must store its output block whole and never read it or its shape. At trace time the helper refuses
an output whose blocks do not tile it (the partial block would add up padding) or that is not a
float. The sum's order changes, so the rewrite is not exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import libcst as cst

from .. import _cst as C
from .._base import APPLICABLE, Applicability, NotApplicable, Rewrite
from .._walk import walk
from ._output import LIKE, Site, aliases, dotted, find, is_whole, output_mode, rebuild

PARTIALS = "_reduction_partials"
LOCALS = ("_pre", "_partial_shape", "_partial_spec")
REDUCTIONS = {"jax.numpy.sum": False, "jax.numpy.mean": True}

_HELPERS = f'''
def _reduction_block_partial(v, dtype):
    """The sum of a block ``v`` of the kernel's output (rounded to its dtype first, as it was
    stored) as an (8, 128) f32 tile: the block's 8 x 128 tiles added up when its last two
    dimensions are multiples of them, else its total at [0, 0]."""
    v = v.astype(dtype).astype(jax.numpy.float32)
    if v.ndim >= 2 and v.shape[-2] % 8 == 0 and v.shape[-1] % 128 == 0:
        v = v.reshape(-1, v.shape[-1])
        acc = v[:, :128]
        for c in range(128, v.shape[1], 128):
            acc = acc + v[:, c:c + 128]
        return acc.reshape(-1, 8, 128).sum(axis=0)
    rows = jax.lax.broadcasted_iota(jax.numpy.int32, (8, 128), 0)
    cols = jax.lax.broadcasted_iota(jax.numpy.int32, (8, 128), 1)
    return jax.numpy.where((rows == 0) & (cols == 0), jax.numpy.sum(v), 0.0)


def {PARTIALS}(pre, out_spec):
    """The partial sums' array and BlockSpec: an (8, 128) f32 tile for each block of the kernel's
    output ``pre``, at that block's index (written where and when the output block was)."""
    if not jax.numpy.issubdtype(pre.dtype, jax.numpy.floating):
        raise ValueError(f"the kernel's output is {{pre.dtype}}: its partial sums are taken for a float output only")
    block_shape = tuple(pre.shape) if out_spec.block_shape is None else tuple(out_spec.block_shape)
    counts = []
    for size, b in zip(pre.shape, block_shape):
        b = b if isinstance(b, int) else 1
        if size % b:
            raise ValueError(f"the output's blocks {{block_shape}} do not tile its shape {{pre.shape}}: "
                             "a block's partial sum would add up its padding")
        counts.append(size // b)
    index_map = out_spec.index_map or (lambda *ids: (0,) * len(pre.shape))

    def index(*ids):
        at = index_map(*ids)
        return (*(tuple(at) if isinstance(at, (tuple, list)) else (at,)), 0, 0)

    return (jax.ShapeDtypeStruct((*counts, 8, 128), jax.numpy.float32),
            pl.BlockSpec((None,) * len(counts) + (8, 128), index))


def _reduction_total(partials, pre, mean):
    """The sum (``mean``: the mean) of the kernel's output ``pre`` from its partial sums, in its dtype."""
    total = jax.numpy.sum(partials)
    if mean:
        count = 1
        for d in pre.shape:
            count *= d
        total = total / count
    return total.astype(pre.dtype)
'''


@dataclasses.dataclass(frozen=True, eq=False)
class _Plan:
    s: Site
    reduction: cst.Call        # jnp.mean(out) in the user (the original node)
    mean: bool


def _operand(call: cst.Call, names: dict[str, str]) -> tuple[cst.BaseExpression, bool] | None:
    """(X, whether a mean) for ``jnp.sum(X)`` / ``jnp.mean(X)`` (``axis=None`` at most) or
    ``X.sum()`` / ``X.mean()``; None for anything else."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in ("sum", "mean") and not call.args \
            and dotted(func, names) not in REDUCTIONS:
        return func.value, func.attr.value == "mean"
    kind = REDUCTIONS.get(dotted(func, names) or "")
    if kind is None or not call.args or call.args[0].keyword is not None or call.args[0].star:
        return None
    rest = call.args[1:]
    if all(a.keyword is not None and a.keyword.value == "axis" and C.code(a.value) == "None" for a in rest):
        return call.args[0].value, kind
    return None


def _plan(module: cst.Module, task: Any) -> _Plan:
    s = find(module, task, "reduction")
    names = aliases(module)
    if output_mode(s.kernel, s.o_ref, names) != "store":
        raise NotApplicable(f"the kernel accumulates into its output block {s.o_ref}: its partial sums would "
                            "follow the accumulation (move it to a scratch first: accumulator)")
    for n in walk(s.kernel.body):
        if (isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == s.o_ref
                and n.attr.value == "shape") or (isinstance(n, cst.Call) and dotted(n.func, names) in LIKE):
            if s.o_ref in C.names_in(n):
                raise NotApplicable(f"the kernel reads its output block's shape ({C.code(n)}): the partial "
                                    "sums' block has another")
    taken = C.names_in(s.site)
    clash = [n for n in LOCALS if n in taken]
    if clash:
        raise NotApplicable(f"{s.site_name}() already uses the name {clash[0]}")
    body = list(s.user.body.body)[s.at:]
    reductions = [(n, *found) for n in walk(cst.Module(body=body)) if isinstance(n, cst.Call)
                  and (found := _operand(n, names)) is not None]
    direct = [(r, mean) for r, x, mean in reductions if x is s.call]
    if direct:
        return _Plan(s, direct[0][0], direct[0][1])
    first = body[0].body[0] if isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1 else None
    if not (isinstance(first, cst.Assign) and first.value is s.call and len(first.targets) == 1
            and isinstance(first.targets[0].target, cst.Name)):
        raise NotApplicable(f"the kernel's output is not summed whole (jnp.sum or jnp.mean of it) in "
                            f"{s.user_name}()")
    out = first.targets[0].target.value
    uses = [n for n in walk(cst.Module(body=body[1:])) if isinstance(n, cst.Name) and n.value == out]
    summed = [(r, mean) for r, x, mean in reductions if isinstance(x, cst.Name) and x.value == out]
    if len(summed) != 1 or len(uses) != 1:
        raise NotApplicable(f"the kernel's output {out} is not summed whole (jnp.sum or jnp.mean of it) and used "
                            f"nowhere else in {s.user_name}() ({len(uses)} uses, {len(summed)} sums)")
    return _Plan(s, summed[0][0], summed[0][1])


class FuseReduction(Rewrite):
    name = "fuse_reduction"
    exact = False        # the sum is taken in another order (block partials, then their total)
    description = ("Move a sum or mean taken of the kernel's output (jnp.mean(out), out.sum()) into the kernel: "
                   "each output block is written as its (8, 128) tile of partial sums and the wrapper adds the "
                   "tiles up, so the output never makes its trip through HBM.")

    def _check(self, module, task) -> Applicability:
        if C.module_function(module, PARTIALS) is not None:
            return Applicability(False, "the kernel's reduction is already fused")
        _plan(module, task)
        return APPLICABLE

    def _apply(self, module, task) -> cst.Module:
        return _fuse(_plan(module, task))


def _fuse(p: _Plan) -> cst.Module:
    s, o = p.s, p.s.o_ref
    # The kernel: each whole store writes the block's partial sums, rounded as the output was.
    k = C.add_kwonly_param(s.kernel, "pre_dtype")

    def dtype(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == o \
                and n.attr.value == "dtype":
            return cst.Name("pre_dtype")
        return None

    def store(n: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(n, cst.Assign) and any(is_whole(t.target, o) for t in n.targets):
            return n.with_changes(value=C.expr(f"_reduction_block_partial({C.code(n.value)}, pre_dtype)"))
        return None

    k = k.with_changes(body=C.transform(C.transform(k.body, dtype), store))
    # The pallas_call: the partial sums' shape and spec for the output's.
    pallas = s.pallas
    first = pallas.args[0].value
    new_first = (C.add_call_kwarg(first, "pre_dtype", "_pre.dtype") if C.is_call(first, "functools.partial")  # type: ignore[arg-type]
                 else C.expr(f"functools.partial({C.code(first)}, pre_dtype=_pre.dtype)"))
    replaced = {"out_specs": "_partial_spec", "out_shape": "_partial_shape"}
    args = [a if a.keyword is None or a.keyword.value not in replaced else
            a.with_changes(value=cst.Name(replaced[a.keyword.value])) for a in pallas.args]
    args[0] = args[0].with_changes(value=new_first)
    new_pallas = pallas.with_changes(args=args)
    setup = C.stmts(f"_pre = {C.code(s.kwarg('out_shape'))}\n"  # type: ignore[arg-type]
                    f"_partial_shape, _partial_spec = {PARTIALS}(_pre, {C.code(s.kwarg('out_specs'))})\n")  # type: ignore[arg-type]
    mean = "True" if p.mean else "False"

    def total(value: cst.BaseExpression) -> cst.BaseExpression:
        return C.expr(f"_reduction_total({C.code(value)}, _pre, mean={mean})")

    def site_node(old: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode | None:
        if old is pallas:
            return new_pallas
        if old is p.reduction and s.inline:        # jnp.mean(out) -> _reduction_total(out, _pre, mean=True)
            return total(_reduced(new))
        return None

    site_at = next(i for i, st in enumerate(s.site.body.body) if C.find_all(st, lambda n: n is s.outer))
    body = list(s.site.body.body)
    rest = [C.transform_original(st, site_node) for st in body[site_at:]]
    if not s.inline:       # the wrapper returns the total; its caller no longer takes it
        ret = rest[-1].body[0]  # type: ignore[attr-defined]
        rest[-1] = rest[-1].with_changes(body=[ret.with_changes(value=total(ret.value))])  # type: ignore[attr-defined]
    site = s.site.with_changes(body=s.site.body.with_changes(body=[*body[:site_at], *setup, *rest]))
    user = None
    if not s.inline:
        user = C.transform_original(s.user, lambda old, new: _reduced(new) if old is p.reduction else None)
    return rebuild(s, k, site, user, _HELPERS)


def _reduced(call: cst.CSTNode) -> cst.BaseExpression:
    """What ``jnp.mean(X)`` / ``X.mean()`` takes the sum of: X."""
    assert isinstance(call, cst.Call)
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("sum", "mean") and not call.args:
        return call.func.value
    return call.args[0].value
