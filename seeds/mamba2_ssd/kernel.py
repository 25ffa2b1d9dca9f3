"""A blocked Pallas kernel of Mamba-2's SSD in its matrix form: a grid over (batch x head, query
block). Each program holds its head's B, x and cumulative log-decay in VMEM (their block does not
move along the query axis, so they are fetched once per head) and walks the key blocks up to the
diagonal and none above it: a loop bounded by ``program_id`` over the key blocks wholly left of
the query block, then the few that cross the diagonal. libtpu's static estimate counts such a
loop by its trips.

The cumulative log-decay cumsum(log(sigmoid(A_log) + 1e-8)) is computed once, before the kernel,
as the reference computes it, and passed in twice: as a column (rows' values) and as a row
(columns' values). It never increases, so for a key block left of the query block's first row R
the decay exp(cs[i] - cs[j]) splits as exp(cs[i] - cs[R]) * exp(cs[R] - cs[j]), both at most 1:
the key factor scales the block's scores, the query factor the running sums once, after the last
such block. Blocks that cross the diagonal take exp(cs[i] - cs[j]) itself where j <= i (0 above).
The numerator (the decayed scores times x, in PV_PASSES bf16 passes: 2 adds the scores' low 16
bits as a second pass, which the check needs: one pass is less precise than the reference) and
the signed row sums are summed in f32 scratch; each row is divided by max(|row sum|, 1) at the
end.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_Q = 512
BLOCK_K = 512
PV_PASSES = 2       # bf16 passes of (decayed scores) x x: 2 adds the scores' low 16 bits as a second pass


def _kernel(c_ref, b_ref, x_ref, rows_ref, cols_ref, o_ref, acc_ref, sum_ref, *, block_q, block_k):
    first = pl.program_id(1) * block_q                 # R, the query block's first row
    c = c_ref[...]
    cs_rows = rows_ref[...]                            # (block_q, 1)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
    sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)

    def accumulate(kb, decay):
        start = pl.multiple_of(kb * block_k, block_k)
        s = jax.lax.dot_general(c, b_ref[pl.ds(start, block_k), :], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * decay
        sum_ref[...] += jnp.sum(s, axis=1, keepdims=True)
        x = x_ref[pl.ds(start, block_k), :]
        if PV_PASSES > 1:       # the scores' top 16 bits, exact in bf16; the low part is s less them
            bits = jax.lax.bitcast_convert_type(s, jnp.uint32) & jnp.uint32(0xFFFF0000)
            high = jax.lax.bitcast_convert_type(bits, jnp.float32)
            acc_ref[...] += jnp.dot((s - high).astype(x.dtype), x, preferred_element_type=jnp.float32)
            s = high
        acc_ref[...] += jnp.dot(s.astype(x.dtype), x, preferred_element_type=jnp.float32)

    full = first // block_k                            # key blocks wholly left of R
    cs_first = cs_rows[0:1, :]                         # cs[R], (1, 1)

    def left(kb, carry):                               # exp(cs[R] - cs[j]): the key factor
        start = pl.multiple_of(kb * block_k, block_k)
        accumulate(kb, jnp.exp(cs_first - cols_ref[:, pl.ds(start, block_k)]))
        return carry

    jax.lax.fori_loop(0, full, left, 0)
    row_factor = jnp.exp(cs_rows - cs_first)           # exp(cs[i] - cs[R])
    acc_ref[...] *= row_factor
    sum_ref[...] *= row_factor
    for n in range(-(-block_q // block_k)):            # the key blocks crossing the diagonal
        kb = full + n
        start = pl.multiple_of(kb * block_k, block_k)
        causal = (first - kb * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
                  >= jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1))
        diff = cs_rows - cols_ref[:, pl.ds(start, block_k)]
        accumulate(kb, jnp.exp(jnp.where(causal, diff, -jnp.inf)))
    total = sum_ref[...]
    total = jnp.where(jnp.abs(total) < 1e-6, 1.0, total)
    o_ref[...] = (acc_ref[...] / jnp.maximum(jnp.abs(total), 1.0)).astype(o_ref.dtype)


@jax.jit
def ssd(c, b, x, a_log):
    bsz, h, s, n = c.shape
    p = x.shape[3]
    bq, bk = min(BLOCK_Q, s), min(BLOCK_K, s)
    if s % bq or s % bk or (bq % bk and bk % bq):
        raise ValueError(f"sequence length {s} is not a multiple of BLOCK_Q={bq} and BLOCK_K={bk}, "
                         "or neither block divides the other")
    cs = jnp.cumsum(jnp.log(jax.nn.sigmoid(a_log.astype(jnp.float32)) + 1e-8), axis=-1)
    heads = bsz * h

    def whole(width):
        return pl.BlockSpec((None, s, width), lambda bh, i: (bh, 0, 0))

    def rows(width):
        return pl.BlockSpec((None, bq, width), lambda bh, i: (bh, i, 0))

    out = pl.pallas_call(
        functools.partial(_kernel, block_q=bq, block_k=bk),
        grid=(heads, s // bq),
        in_specs=[rows(n), whole(n), whole(p), rows(1), pl.BlockSpec((None, 1, s), lambda bh, i: (bh, 0, 0))],
        out_specs=rows(p),
        out_shape=jax.ShapeDtypeStruct((heads, s, p), x.dtype),
        scratch_shapes=[pltpu.VMEM((bq, p), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=48 << 20),
    )(c.reshape(heads, s, n), b.reshape(heads, s, n), x.reshape(heads, s, p),
      cs.reshape(heads, s, 1), cs.reshape(heads, 1, s))
    return out.reshape(bsz, h, s, p)
