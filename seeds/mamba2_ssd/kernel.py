"""A chunked Pallas kernel of Mamba-2's SSD in its matrix form: one program per (batch x head)
whose C, B, x and cumulative log-decay stay in VMEM while it walks, for each query block, the key
blocks up to the diagonal and none above it.

The cumulative log-decay cumsum(log(sigmoid(A_log) + 1e-8)) is computed once, before the kernel,
as the reference computes it, and passed in twice: as a column (rows' values) and as a row
(columns' values). It never increases, so for a key block left of the query block's first row R
the decay exp(cs[i] - cs[j]) splits as exp(cs[i] - cs[R]) * exp(cs[R] - cs[j]), both at most 1:
the key factor scales the block's scores, the query factor the running sums once, after the last
such block. Blocks that cross the diagonal take exp(cs[i] - cs[j]) itself where j <= i (0 above).

The query blocks are a Python loop and each one's key loop has constant bounds: libtpu's static
estimate counts a loop of constant bounds by its trips, but guesses those of one bounded by
``program_id``. The numerator (the decayed scores times x, in PV_PASSES bf16 passes: 2 adds the
scores' bf16 rounding error as a second pass) and the signed row sums are summed in f32 scratch;
each row is divided by max(|row sum|, 1) at the end.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_Q = 512
BLOCK_K = 1024
PV_PASSES = 2       # bf16 passes of (decayed scores) x x: 2 splits the scores into a bf16 high and low part


def _kernel(c_ref, b_ref, x_ref, rows_ref, cols_ref, o_ref, acc_ref, sum_ref, *, block_q, block_k):
    def accumulate(c, kb, decay):
        start = pl.multiple_of(kb * block_k, block_k)
        s = jax.lax.dot_general(c, b_ref[pl.ds(start, block_k), :], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * decay
        sum_ref[...] += jnp.sum(s, axis=1, keepdims=True)
        x = x_ref[pl.ds(start, block_k), :]
        high = s.astype(x.dtype)
        acc_ref[...] += jnp.dot(high, x, preferred_element_type=jnp.float32)
        if PV_PASSES > 1:
            low = (s - high.astype(jnp.float32)).astype(x.dtype)
            acc_ref[...] += jnp.dot(low, x, preferred_element_type=jnp.float32)

    for first in range(0, c_ref.shape[0], block_q):
        c = c_ref[pl.ds(first, block_q), :]
        cs_rows = rows_ref[pl.ds(first, block_q), :]               # (block_q, 1)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
        full = first // block_k                                    # key blocks wholly left of R
        if full:
            cs_first = rows_ref[pl.ds(first, 1), :]                # cs[R], (1, 1)

            def left(kb, carry, c=c, cs_first=cs_first):          # exp(cs[R] - cs[j]): the key factor
                start = pl.multiple_of(kb * block_k, block_k)
                accumulate(c, kb, jnp.exp(cs_first - cols_ref[:, pl.ds(start, block_k)]))
                return carry

            jax.lax.fori_loop(0, full, left, 0)
            row_factor = jnp.exp(cs_rows - cs_first)               # exp(cs[i] - cs[R])
            acc_ref[...] *= row_factor
            sum_ref[...] *= row_factor
        for kb in range(full, -(-(first + block_q) // block_k)):   # blocks crossing the diagonal
            causal = (first - kb * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
                      >= jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1))
            diff = cs_rows - cols_ref[:, pl.ds(kb * block_k, block_k)]
            accumulate(c, kb, jnp.exp(jnp.where(causal, diff, -jnp.inf)))
        total = sum_ref[...]
        total = jnp.where(jnp.abs(total) < 1e-6, 1.0, total)
        o_ref[pl.ds(first, block_q), :] = (acc_ref[...] / jnp.maximum(jnp.abs(total), 1.0)).astype(o_ref.dtype)


@jax.jit
def ssd(c, b, x, a_log):
    bsz, h, s, n = c.shape
    p = x.shape[3]
    bq, bk = min(BLOCK_Q, s), min(BLOCK_K, s)
    if s % bq or s % bk:
        raise ValueError(f"sequence length {s} is not a multiple of BLOCK_Q={bq} and BLOCK_K={bk}")
    cs = jnp.cumsum(jnp.log(jax.nn.sigmoid(a_log.astype(jnp.float32)) + 1e-8), axis=-1)
    heads = bsz * h

    def whole(width):
        return pl.BlockSpec((None, s, width), lambda bh: (bh, 0, 0))

    out = pl.pallas_call(
        functools.partial(_kernel, block_q=bq, block_k=bk),
        grid=(heads,),
        in_specs=[whole(n), whole(n), whole(p), whole(1), pl.BlockSpec((None, 1, s), lambda bh: (bh, 0, 0))],
        out_specs=whole(p),
        out_shape=jax.ShapeDtypeStruct((heads, s, p), x.dtype),
        scratch_shapes=[pltpu.VMEM((bq, p), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=48 << 20),
    )(c.reshape(heads, s, n), b.reshape(heads, s, n), x.reshape(heads, s, p),
      cs.reshape(heads, s, 1), cs.reshape(heads, 1, s))
    return out.reshape(bsz, h, s, p)
