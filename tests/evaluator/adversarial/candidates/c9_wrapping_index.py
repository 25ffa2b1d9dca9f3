"""CLASS 9 (index maps): a decode kernel whose K/V block index overflows int32 back onto itself.

Index maps run in int32, on the chip and in the interpreter: their arithmetic wraps modulo 2**32.
A model of the HBM traffic that evaluated the Mosaic index-map functions with Python's unbounded
integers would not wrap: the block index ``j + (b + 1) * 65536 * 65536`` (``j`` in int32) would be
``j + (b + 1) * 2**32`` there, far past the end of the cache, and every K/V block would be clipped
to nothing: the whole cache read in no bytes of the judge's figure.

This is the naive kernel of the seed, reading its whole cache once per query head, with that index
map on K and V. The same blocks, the same DMAs, the same work.

Honest twin (``HONEST = True``): the plain index map ``(b, h // group, j, 0)``.

Expected: correct, and counted as the honest twin: the same HBM bytes. Measured against a model
that did not wrap: 32,768 bytes (q and the output alone) to the twin's 16,809,984 at the test
shape; with BLOCK_KV = 2048 at N=8192, where the HBM floor is the figure, 106,680 cycles (the bare
estimate) to the twin's 122,971.
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HONEST = False

# Tunables.
BLOCK_KV = 512
# 65536 * 65536 = 2**32: a multiple of it is 0 in int32.
WRAP = 65536

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


def _kv_spec(block_kv, head_dim, group):
    """The K/V window of grid step (b, h, j): cache block j of K/V head h // group of sequence b."""
    # lax.div (truncating; h >= 0), not //: floor division lowers through sign(), which asks for a TPU.
    if HONEST:
        return pl.BlockSpec((1, 1, block_kv, head_dim),
                            lambda b, h, j, lengths: (b, jax.lax.div(h, group), j, 0))
    # (b + 1) * 2**32 is 0 in int32 (two multiplications by 65536, each wrapping): the block index
    # is j, on the chip and in the interpreter, for every b.
    return pl.BlockSpec((1, 1, block_kv, head_dim),
                        lambda b, h, j, lengths: (b, jax.lax.div(h, group), j + (b + 1) * WRAP * WRAP, 0))


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
    kv_spec = _kv_spec(block_kv, head_dim, group)
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
