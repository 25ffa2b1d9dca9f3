"""A naive Pallas grouped matmul: small tiles (128 rows, 512 wide), one visit per (group, row
tile) pair, rows outside the visit's group masked out of the product, a K loop accumulating in an
f32 scratch. Each visit finds its group and tile from the group sizes alone (scalar code over the
groups, in the index maps and the kernel), so nothing but the sizes themselves is prefetched, and
no branch depends on them (the accumulator is reset by a select).
(At 128 x 128 x 128 the compiler's profiler runs out of memory on the default task's grid.)"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = 128
BLOCK_N = 512
BLOCK_K = 512


def _locate(sizes_ref, v, bm, m):
    """Visit ``v``'s group, row tile and the group's rows [lo, hi): every non-empty group's tiles in
    order, then padding visits on the last tile that keep no rows (lo = hi = m)."""
    group, tile, lo, hi = sizes_ref.shape[0] - 1, m // bm - 1, m, m
    start, before = 0, 0
    for g in range(sizes_ref.shape[0]):
        size = sizes_ref[g]
        end = start + size
        count = jnp.where(size > 0, (end - 1) // bm - start // bm + 1, 0)
        here = jnp.logical_and(v >= before, v < before + count)
        group = jnp.where(here, g, group)
        tile = jnp.where(here, start // bm + v - before, tile)
        lo = jnp.where(here, start, lo)
        hi = jnp.where(here, end, hi)
        start, before = end, before + count
    return group, tile, lo, hi


def _kernel(sizes_ref, lhs_ref, rhs_ref, out_ref, acc_ref, *, m):
    v, k = pl.program_id(1), pl.program_id(2)
    bm = lhs_ref.shape[0]
    _, tile, lo, hi = _locate(sizes_ref, v, bm, m)

    fresh = jnp.logical_and(k == 0, lo <= tile * bm)      # the tile's first visit starts from zero
    rows = tile * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
    keep = jnp.logical_and(rows >= lo, rows < hi)
    product = jnp.dot(lhs_ref[...], rhs_ref[...], preferred_element_type=jnp.float32)
    acc_ref[...] = jnp.where(fresh, 0.0, acc_ref[...]) + jnp.where(keep, product, 0.0)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


@jax.jit
def gmm(lhs, rhs, group_sizes):
    m, k = lhs.shape
    num_groups, _, n = rhs.shape
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), min(BLOCK_K, k)

    def lhs_map(j, v, kk, sizes):
        return _locate(sizes, v, bm, m)[1], kk

    def rhs_map(j, v, kk, sizes):
        return _locate(sizes, v, bm, m)[0], kk, j

    def out_map(j, v, kk, sizes):
        return _locate(sizes, v, bm, m)[1], j

    return pl.pallas_call(
        functools.partial(_kernel, m=m),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(n // bn, m // bm + num_groups - 1, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lhs_map), pl.BlockSpec((None, bk, bn), rhs_map)],
            out_specs=pl.BlockSpec((bm, bn), out_map),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
    )(group_sizes.astype(jnp.int32), lhs, rhs)
