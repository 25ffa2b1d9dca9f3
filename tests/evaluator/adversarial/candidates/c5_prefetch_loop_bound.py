"""CLASS 5: the KV loop runs inside the kernel, its trip count read from a scalar-prefetch value.

Expected: correct, then FAIL_TIMING naming data_dependent_loop: the static estimate guesses the
trip count of a loop whose bound is data, whatever the real count.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_Q = 128
BLOCK_KV = 128
BOUND_FROM_PREFETCH = True   # False: the same loop with the bound as a compile-time constant
STATS_LANES = 128
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _kernel(nkv_ref, q_ref, k_ref, v_ref, o_ref, *, sm_scale, causal, block_q, block_kv, num_kv):
    q_index = pl.program_id(2)
    q = q_ref[0, 0]

    def body(j, carry):
        m_prev, l_prev, acc = carry
        start = pl.multiple_of(j * block_kv, block_kv)
        k = k_ref[0, 0, pl.ds(start, block_kv), :]
        v = v_ref[0, 0, pl.ds(start, block_kv), :]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        s = s * sm_scale
        if causal:
            rows = q_index * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
            cols = start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(cols <= rows, s, MASK_VALUE)
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, :1])
        l_next = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
        return m_next, l_next, acc * alpha[:, :1] + pv

    bound = nkv_ref[0] if BOUND_FROM_PREFETCH else num_kv
    init = (jnp.full((block_q, STATS_LANES), -jnp.inf, jnp.float32),
            jnp.zeros((block_q, STATS_LANES), jnp.float32),
            jnp.zeros((block_q, q.shape[-1]), jnp.float32))
    _, l_final, acc = jax.lax.fori_loop(0, bound, body, init)
    o_ref[0, 0] = (acc / l_final[:, :1]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale"))
def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    batch, heads, seq_len, head_dim = q.shape
    block_q, block_kv = min(BLOCK_Q, seq_len), min(BLOCK_KV, seq_len)
    num_kv = seq_len // block_kv
    kernel = functools.partial(_kernel, sm_scale=sm_scale, causal=causal, block_q=block_q,
                               block_kv=block_kv, num_kv=num_kv)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, heads, seq_len // block_q),
            in_specs=[
                pl.BlockSpec((1, 1, block_q, head_dim), lambda b, h, i, n: (b, h, i, 0)),
                pl.BlockSpec((1, 1, seq_len, head_dim), lambda b, h, i, n: (b, h, 0, 0)),
                pl.BlockSpec((1, 1, seq_len, head_dim), lambda b, h, i, n: (b, h, 0, 0)),
            ],
            out_specs=pl.BlockSpec((1, 1, block_q, head_dim), lambda b, h, i, n: (b, h, i, 0)),
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel")),
    )(jnp.array([num_kv], jnp.int32), q, k, v)
