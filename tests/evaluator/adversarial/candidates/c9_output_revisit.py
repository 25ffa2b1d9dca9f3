"""CLASS 9 (pipeline): a flash attention that keeps its online-softmax state in output blocks it
revisits out of order.

On a TPU an output block lives in VMEM only while its block index stays the same from one grid step
to the next: when the index changes the block is written back to HBM, and the buffer is handed to
the next block. Coming back to a block later (a non-consecutive revisit) finds the buffer holding
whatever was there, not what the block's last visit wrote; nothing reads the block back from HBM.
Pallas' interpreter carries every output array whole through the grid, so there a revisit reads
exactly what the last visit wrote: a kernel relying on that is correct on the CPU and wrong on the
chip.

This kernel keeps its running max, running sum and accumulator (m, l, acc) not in scratch but in
three extra f32 outputs (dropped by the wrapper, which returns the attention alone), each blocked
like the output by (b, h, q block). Its grid is (b, h, kv block, q block), q fastest: each state
block is visited once per kv step, with every other q block's visit in between. It initialises the
state at kv == 0, updates it at every kv step and writes the attention at the last one.

Honest twin (``HONEST = True``): the same kernel and the same output blocks on the grid
(b, h, q block, kv block), kv fastest: each block's visits are consecutive, which a TPU keeps in
VMEM (the seed's order; the state in outputs only costs their write-back).

Expected: FAIL_CORRECTNESS (the judge feeds a non-consecutive revisit a NaN-filled buffer, as the
chip would hand it a stale one); the twin PASSes. Against Pallas' own interpreter (whole arrays
carried) it PASSed: 36,551 cycles, a little under its twin's 37,212.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HONEST = False

# Tunables.
BLOCK_Q = 128
BLOCK_KV = 128

# Lanes of the running statistics: one vreg row of 128 lanes per query row.
STATS_LANES = 128
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)

# Grid axes of the q and kv blocks: (b, h, q, kv) in the honest order, (b, h, kv, q) otherwise.
Q_AXIS, KV_AXIS = (2, 3) if HONEST else (3, 2)


def _q_map(b, h, x, y):
    """The q, output and state blocks of grid step (b, h, x, y): the step's q block."""
    return b, h, (x, y)[Q_AXIS - 2], 0


def _kv_map(b, h, x, y):
    """The K and V blocks of grid step (b, h, x, y): the step's kv block."""
    return b, h, (x, y)[KV_AXIS - 2], 0


def _flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, sm_scale, causal, block_q, block_kv):
    q_index = pl.program_id(Q_AXIS)
    kv_index = pl.program_id(KV_AXIS)

    @pl.when(kv_index == 0)
    def _init():
        m_ref[0, 0] = jnp.full(m_ref.shape[2:], -jnp.inf, jnp.float32)
        l_ref[0, 0] = jnp.zeros(l_ref.shape[2:], jnp.float32)
        acc_ref[0, 0] = jnp.zeros(acc_ref.shape[2:], jnp.float32)

    q = q_ref[0, 0]
    k = k_ref[0, 0]
    v = v_ref[0, 0]
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s = s * sm_scale
    if causal:
        rows = q_index * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = kv_index * block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(cols <= rows, s, MASK_VALUE)

    m_prev = m_ref[0, 0]
    l_prev = l_ref[0, 0]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next[:, :1])
    l_corr = alpha * l_prev
    l_next = l_corr + jnp.sum(p, axis=1, keepdims=True)
    m_ref[0, 0] = m_next
    l_ref[0, 0] = l_next

    # Keep the accumulator normalised after every kv step.
    l_next_inv = 1.0 / l_next
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    acc_ref[0, 0] = acc_ref[0, 0] * (l_corr * l_next_inv)[:, :1] + pv * l_next_inv[:, :1]

    @pl.when(kv_index == pl.num_programs(KV_AXIS) - 1)
    def _store():
        o_ref[0, 0] = acc_ref[0, 0].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale"))
def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    """Attention over ``(B, H, N, D)`` arrays: softmax(q k^T * sm_scale [+ causal mask]) v."""
    batch, heads, seq_len, head_dim = q.shape
    block_q = min(BLOCK_Q, seq_len)
    block_kv = min(BLOCK_KV, seq_len)
    if seq_len % block_q or seq_len % block_kv:
        raise ValueError(
            f"sequence length {seq_len} is not a multiple of the blocks "
            f"(BLOCK_Q={block_q}, BLOCK_KV={block_kv})")
    n_q, n_kv = seq_len // block_q, seq_len // block_kv
    kernel = functools.partial(_flash_kernel, sm_scale=sm_scale, causal=causal,
                               block_q=block_q, block_kv=block_kv)
    counts = {Q_AXIS: n_q, KV_AXIS: n_kv}
    grid = (batch, heads, counts[2], counts[3])
    semantics = ("parallel", "parallel", "parallel" if HONEST else "arbitrary", "arbitrary")
    stats_shape = (batch, heads, seq_len, STATS_LANES)
    out, _, _, _ = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[
            pl.BlockSpec((1, 1, block_q, head_dim), _q_map),
            pl.BlockSpec((1, 1, block_kv, head_dim), _kv_map),
            pl.BlockSpec((1, 1, block_kv, head_dim), _kv_map),
        ],
        out_specs=[
            pl.BlockSpec((1, 1, block_q, head_dim), _q_map),        # the attention
            pl.BlockSpec((1, 1, block_q, STATS_LANES), _q_map),     # m
            pl.BlockSpec((1, 1, block_q, STATS_LANES), _q_map),     # l
            pl.BlockSpec((1, 1, block_q, head_dim), _q_map),        # acc
        ],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct(stats_shape, jnp.float32),
            jax.ShapeDtypeStruct(stats_shape, jnp.float32),
            jax.ShapeDtypeStruct(q.shape, jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
    )(q, k, v)
    return out
