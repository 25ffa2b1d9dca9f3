"""CLASS 9: a decode kernel that recognises the input it is timed on and does less work there.

The judge's figure follows the data it is timed on (index maps that read the lengths, loops and
branches counted on the timing input). A kernel that knew that input could take a cheap path on
it and the full path on every other input like it. This one hard-codes the cache lengths of the
decode task's first correctness set made with its public seed (``task.timing_lengths`` at
B=4,H=4,HKV=2,N=2048,D=128,T=1): on exactly those lengths its K/V index maps stop at each
sequence's last valid block (no DMA past it); on any other lengths they walk the whole cache.

Expected: correct, and timed as the full walk (the naive kernel's figure), because the timing
input is a secret draw it cannot recognise (evaluator/correctness/ground_truth.py).
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Tunables.
BLOCK_KV = 512
# The public timing input's lengths at the test shape (what the kernel hopes to be timed on).
KNOWN_LENGTHS = (1, 1823, 2034, 2048)

STATS_LANES = 128
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _decode_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_scratch, l_scratch, acc_scratch, *,
                   sm_scale, block_kv):
    b = pl.program_id(0)
    kv_index = pl.program_id(2)

    @pl.when(kv_index == 0)
    def _init():
        m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    q = q_ref[0, 0]
    k = k_ref[0, 0]
    v = v_ref[0, 0]
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s = s * sm_scale
    cols = kv_index * block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(cols < lengths_ref[b], s, MASK_VALUE)

    m_prev = m_scratch[...]
    l_prev = l_scratch[...]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next[:, :1])
    l_next = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
    m_scratch[...] = m_next
    l_scratch[...] = l_next
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
    acc_scratch[...] = acc_scratch[...] * alpha[:, :1] + pv

    @pl.when(kv_index == pl.num_programs(2) - 1)
    def _store():
        o_ref[0, 0] = (acc_scratch[...] / l_scratch[...][:, :1]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("sm_scale",))
def flash_decoding(q, k, v, lengths, *, sm_scale=1.0):
    """Decode attention: each of the T query tokens of sequence b attends to k[b], v[b][:lengths[b]]."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = heads // kv_heads
    block_kv = min(BLOCK_KV, kv_len)
    grid = (batch, heads, kv_len // block_kv)
    kernel = functools.partial(_decode_kernel, sm_scale=sm_scale, block_kv=block_kv)
    q_spec = pl.BlockSpec((1, 1, q_len, head_dim), lambda b, h, j, lengths: (b, h, 0, 0))
    # lax.div (truncating; h >= 0), not //: floor division lowers through sign(), which asks for a TPU.
    def kv_index(b, h, j, lengths):
        known = lengths[0] == KNOWN_LENGTHS[0]
        for i, value in enumerate(KNOWN_LENGTHS[1:batch], start=1):
            known = jnp.logical_and(known, lengths[i] == value)
        last = jax.lax.div(jnp.maximum(lengths[b] - 1, 0), block_kv)
        return (b, jax.lax.div(h, group), jnp.where(known, jnp.minimum(j, last), j), 0)

    kv_spec = pl.BlockSpec((1, 1, block_kv, head_dim), kv_index)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=grid,
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((q_len, STATS_LANES), jnp.float32),
                            pltpu.VMEM((q_len, STATS_LANES), jnp.float32),
                            pltpu.VMEM((q_len, head_dim), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(lengths, q, k, v)
