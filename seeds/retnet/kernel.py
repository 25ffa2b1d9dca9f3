"""A chunked Pallas retention kernel (RetNet): one program per (batch x head) whose queries, keys
and values stay in VMEM while it walks, for each query block, the key blocks up to the diagonal
and none above it.

The query blocks are a Python loop and each one's key loop has constant bounds: libtpu's static
estimate counts a loop whose bounds are constants by its trips, but guesses the trips of one
bounded by ``program_id`` (a grid over query blocks with a key loop up to the diagonal was
estimated at the same cost per step whatever its trips), and a grid over key blocks pays the
step overhead of every skipped block above the diagonal.

The decay gamma^(i-j) of a key block left of the query block's first row R is split as
gamma^(i-R) * gamma^(R-j), both at most 1: the key factor scales the block's scores, the query
factor the running sums once, after the last such block. Blocks that cross the diagonal take
gamma^(i-j) itself, masked where j > i, from tiles made once per head (they depend only on the
block's offset from the diagonal). The numerator (the decayed scores cast to bf16, times V) and
the row sums of |scores * decay| are summed in f32 scratch and each row is divided by
max(row sum, 1) at the end: the reference divides before its cast to bf16, which rounds the
quotient by the same relative amount.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_Q = 512
BLOCK_K = 1024
PV_PASSES = 2       # bf16 passes of (decayed scores) x V: 2 splits the scores into a bf16 high and low part


def _diagonal_offsets(seq_len, block_q, block_k):
    """Per query block: its first row, the key blocks wholly left of it, and its blocks crossing
    the diagonal as (key block, offset of the query block's first row from the key block's)."""
    plan = []
    for first in range(0, seq_len, block_q):
        full = first // block_k
        last = -(-(first + block_q) // block_k)
        plan.append((first, full, [(kb, first - kb * block_k) for kb in range(full, last)]))
    return plan


def _kernel(lg_ref, q_ref, k_ref, v_ref, o_ref, decay_ref, acc_ref, sum_ref, *, heads, block_q, block_k):
    lg = lg_ref[pl.program_id(0) % heads]              # log gamma of this head
    plan = _diagonal_offsets(q_ref.shape[0], block_q, block_k)
    offsets = sorted({off for _, _, diagonal in plan for _, off in diagonal})
    for n, off in enumerate(offsets):                  # gamma^(i-j), 0 above the diagonal
        dist = (off + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
                - jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1))
        decay_ref[n] = jnp.exp(jnp.where(dist >= 0, lg * dist.astype(jnp.float32), -jnp.inf))
    rows = jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0).astype(jnp.float32)
    row_factor = jnp.exp(lg * rows)                    # gamma^(i-R)

    def accumulate(q, kb, scale):
        start = pl.multiple_of(kb * block_k, block_k)
        s = jax.lax.dot_general(q, k_ref[pl.ds(start, block_k), :], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale
        sum_ref[...] += jnp.sum(jnp.abs(s), axis=1, keepdims=True)
        v = v_ref[pl.ds(start, block_k), :]
        high = s.astype(v.dtype)
        acc_ref[...] += jnp.dot(high, v, preferred_element_type=jnp.float32)
        if PV_PASSES > 1:
            low = (s - high.astype(jnp.float32)).astype(v.dtype)
            acc_ref[...] += jnp.dot(low, v, preferred_element_type=jnp.float32)

    for first, full, diagonal in plan:
        q = q_ref[pl.ds(first, block_q), :]
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
        if full:
            def left(kb, carry, q=q, first=first):     # gamma^(R-j): the key factor only
                back = first - kb * block_k - jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
                accumulate(q, kb, jnp.exp(lg * back.astype(jnp.float32)))
                return carry

            jax.lax.fori_loop(0, full, left, 0)
            acc_ref[...] *= row_factor
            sum_ref[...] *= row_factor
        for kb, off in diagonal:
            accumulate(q, kb, decay_ref[offsets.index(off)])
        o_ref[pl.ds(first, block_q), :] = (acc_ref[...] / jnp.maximum(sum_ref[...], 1.0)).astype(o_ref.dtype)


@jax.jit
def retention(q, k, v):
    b, h, s, d = q.shape
    bq, bk = min(BLOCK_Q, s), min(BLOCK_K, s)
    if s % bq or s % bk:
        raise ValueError(f"sequence length {s} is not a multiple of BLOCK_Q={bq} and BLOCK_K={bk}")
    offsets = {off for _, _, diagonal in _diagonal_offsets(s, bq, bk) for _, off in diagonal}
    log_gamma = jnp.log(1.0 - jnp.exp2(-5.0 - jnp.arange(h, dtype=jnp.float32)))
    whole = pl.BlockSpec((None, s, d), lambda bh: (bh, 0, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, heads=h, block_q=bq, block_k=bk),
        grid=(b * h,),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), whole, whole, whole],
        out_specs=whole,
        out_shape=jax.ShapeDtypeStruct((b * h, s, d), q.dtype),
        scratch_shapes=[pltpu.VMEM((len(offsets), bq, bk), jnp.float32),
                        pltpu.VMEM((bq, d), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=48 << 20),
    )(log_gamma, *(x.reshape(b * h, s, d) for x in (q, k, v)))
    return out.reshape(b, h, s, d)
