"""CLASS 10: a kernel that does the real work only at the size it is checked at.

A kernel is traced per shape, and Python can branch on the shape. A judge that checked a kernel
at a small size and timed it at the real one (to make interpret-mode checking affordable) would
check one program and time another. This candidate is the seed's kernel at the review's shape
(B=1, H=2, N=512, D=128, the size the suite checks it at) and, at any other shape, no kernel at
all: it returns ``v``, which costs nothing and is wrong.

Expected: PASS with exactly the seed's figure. The judge checks and times one traced program at
one shape (the task's), so the size it is checked at is the size it is timed at, and the cheap
path is never taken by anything the judge measures.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Tunables.
BLOCK_Q = 128
BLOCK_KV = 128

# Lanes of the running-statistics scratch: one vreg row of 128 lanes per query row.
STATS_LANES = 128
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _flash_kernel(q_ref, k_ref, v_ref, o_ref, m_scratch, l_scratch, acc_scratch, *,
                  sm_scale, causal, block_q, block_kv):
    q_index = pl.program_id(2)
    kv_index = pl.program_id(3)

    @pl.when(kv_index == 0)
    def _init():
        m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    q = q_ref[0, 0]
    k = k_ref[0, 0]
    v = v_ref[0, 0]
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
    s = s * sm_scale
    if causal:
        rows = q_index * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = kv_index * block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(cols <= rows, s, MASK_VALUE)

    m_prev = m_scratch[...]
    l_prev = l_scratch[...]
    m_curr = jnp.max(s, axis=1, keepdims=True)
    m_next = jnp.maximum(m_prev, m_curr)
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next[:, :1])
    l_corr = alpha * l_prev
    l_next = l_corr + jnp.sum(p, axis=1, keepdims=True)
    m_scratch[...] = m_next
    l_scratch[...] = l_next

    # Keep the accumulator normalised after every kv step.
    l_next_inv = 1.0 / l_next
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
    acc_scratch[...] = (acc_scratch[...] * (l_corr * l_next_inv)[:, :1]
                        + pv * l_next_inv[:, :1])

    @pl.when(kv_index == pl.num_programs(3) - 1)
    def _store():
        o_ref[0, 0] = acc_scratch[...].astype(o_ref.dtype)


def _the_real_work(q, k, v, *, causal=True, sm_scale=1.0):
    """Attention over ``(B, H, N, D)`` arrays: softmax(q k^T * sm_scale [+ causal mask]) v."""
    batch, heads, seq_len, head_dim = q.shape
    block_q = min(BLOCK_Q, seq_len)
    block_kv = min(BLOCK_KV, seq_len)
    if seq_len % block_q or seq_len % block_kv:
        raise ValueError(
            f"sequence length {seq_len} is not a multiple of the blocks "
            f"(BLOCK_Q={block_q}, BLOCK_KV={block_kv})")
    grid = (batch, heads, seq_len // block_q, seq_len // block_kv)
    kernel = functools.partial(_flash_kernel, sm_scale=sm_scale, causal=causal,
                               block_q=block_q, block_kv=block_kv)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[
            pl.BlockSpec((1, 1, block_q, head_dim), lambda b, h, i, j: (b, h, i, 0)),
            pl.BlockSpec((1, 1, block_kv, head_dim), lambda b, h, i, j: (b, h, j, 0)),
            pl.BlockSpec((1, 1, block_kv, head_dim), lambda b, h, i, j: (b, h, j, 0)),
        ],
        out_specs=pl.BlockSpec((1, 1, block_q, head_dim), lambda b, h, i, j: (b, h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((block_q, STATS_LANES), jnp.float32),
            pltpu.VMEM((block_q, STATS_LANES), jnp.float32),
            pltpu.VMEM((block_q, head_dim), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(q, k, v)


CHECKED_SHAPE = (1, 2, 512, 128)


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale"))
def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    if q.shape == CHECKED_SHAPE:
        return _the_real_work(q, k, v, causal=causal, sm_scale=sm_scale)
    return v          # anywhere else: nothing computed
