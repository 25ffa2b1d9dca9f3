"""CLASS 9 (index maps): a decode kernel whose K/V windows are given in elements, not blocks.

A block dimension written ``pl.Element(n)`` makes the index map return the *element* offset of the
window on that axis, not its block index (Mosaic's ``#tpu.element_window``: the window is ``n``
entries from that offset). A model of the HBM traffic that read every index map's result as a
block index would take the offset ``j * BLOCK_KV`` of cache block ``j`` for block number
``j * BLOCK_KV``, far past the end of the cache: every block after the first would be clipped to
nothing, and three quarters of the cache read (at N=2048) would move no bytes in the judge's
figure.

This is the naive kernel of the seed, reading its whole cache, with its K/V BlockSpecs written in
elements: ``(None, None, pl.Element(BLOCK_KV), pl.Element(D))`` (a window cannot mix element and
block dimensions; None is a squeezed dimension of one entry, whose offset is its index) and the
index map ``(b, h // group, j * BLOCK_KV, 0)``. The same windows, the same DMAs, the same work.

Honest twin (``HONEST = True``): the ordinary blocked windows ``(None, None, BLOCK_KV, D)`` and the
block index ``j``.

Expected: correct, then FAIL_TIMING naming the element window under the compiler estimate (see
below); its bytes are counted as the honest twin's (the whole cache per query head:
``tests/evaluator/figure/test_hbm_traffic.py`` holds the model to that). Measured against a model that
read offsets as block indices: 4,227,072 bytes to the twin's 16,809,984 at the test shape; with
BLOCK_KV = 2048 at N=8192, where the HBM floor is the figure, 71,220 cycles to the twin's 122,971.

Beyond the bytes (libtpu 0.0.42.1, v5e): the compiler's static estimate of this kernel is itself
lower than its twin's, 52,278 cycles to 72,534 at the test shape (BLOCK_KV = 512, where the
estimate is the figure): about 300 cycles a grid step less, nearly the estimate of a kernel that
fetches one block per head and never another (50,342 cycles either way). The estimate does not
seem to count an element window's per-step DMA; the chip must still make it. So the judge
refuses an element window's figure under the estimate, by name (``hbm_traffic.Traffic.estimate_misses``).
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HONEST = False

# Tunables.
BLOCK_KV = 512

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
    k = k_ref[...]          # (block_kv, D): the window's squeezed dimensions are gone
    v = v_ref[...]
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
        return pl.BlockSpec((None, None, block_kv, head_dim),
                            lambda b, h, j, lengths: (b, jax.lax.div(h, group), j, 0))
    # Element dimensions: the index map gives the window's first entry on each axis.
    return pl.BlockSpec((None, None, pl.Element(block_kv), pl.Element(head_dim)),
                        lambda b, h, j, lengths: (b, jax.lax.div(h, group), j * block_kv, 0))


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
