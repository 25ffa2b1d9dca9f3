"""CLASS 9 (trips): all of a head's work in one grid entry of sixteen, the rest running no trips.

The grid is (batch, heads, 16). Each entry runs a loop over the q blocks whose bound is read from
a scalar-prefetch array of trip counts made in the wrapper: 0 for entries 0..14 and every q block
(num_q) for entry 15. Inside, each q block runs a causal kv loop bounded by the outer loop's
induction variable (``fori_loop(0, qi + 1)``), with an online softmax, and writes its rows of the
output. Every block spans a whole head and its index map depends on (b, h) alone, so the sixteen
entries of a head revisit one output block, consecutively (legal on a TPU: the block is written
back once, after the last of them).

The outer loop is a data-dependent ``while``: 32 entries at B=1, H=2, 8 trips in all, a mean of a
quarter of a trip per entry. The judge used to count it by that mean alone, extrapolated linearly
from static variants of one and two trips in every entry, while the inner loop, bounded by the
outer one's induction variable, was no site: each variant's estimate simulated it on the variant's
made-up trips (trip t runs t + 1 kv blocks), so the work that all falls in one entry was charged
as a sliver of it in every entry. It PASSed at 1,921 cycles (the estimate's figure was negative,
clamped to 0: the HBM floor alone) against 18,936 for its twin.

Now the inner loop is a site too (a loop fed by a counted loop's carry is counted), the figure
is multilinear in the two loops' means (the variant that moves both is compiled), and the
estimate's linearity in each loop's trips is checked, since their trips are uneven.

Expected: correct, and scored within 10% of its honest twin.
Honest twin (``HONEST = True``): the same work on the same grid written plainly, the outer loop's
bound a function of the grid index (``program_id(2) == 15``), which the estimate simulates
exactly. (Written with one entry per head instead, it is 15,949 cycles: sixteen grid steps per head
cost their pipeline's overhead.)
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HONEST = False
BLOCK_Q = 128
BLOCK_KV = 128
ENTRIES = 16          # grid entries per head; the last one does the work
STATS_LANES = 128
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _kernel(trips_ref, q_ref, k_ref, v_ref, o_ref, *, sm_scale, causal, block_q, block_kv, num_q, num_kv):
    head_dim = q_ref.shape[-1]

    def q_body(qi, carry):
        q_start = pl.multiple_of(qi * block_q, block_q)
        q = q_ref[0, 0, pl.ds(q_start, block_q), :]

        def kv_body(j, state):
            m_prev, l_prev, acc = state
            start = pl.multiple_of(j * block_kv, block_kv)
            k = k_ref[0, 0, pl.ds(start, block_kv), :]
            v = v_ref[0, 0, pl.ds(start, block_kv), :]
            s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            s = s * sm_scale
            if causal:
                rows = q_start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
                cols = start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
                s = jnp.where(cols <= rows, s, MASK_VALUE)
            m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
            alpha = jnp.exp(m_prev - m_next)
            p = jnp.exp(s - m_next[:, :1])
            l_next = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
            pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)
            return m_next, l_next, acc * alpha[:, :1] + pv

        init = (jnp.full((block_q, STATS_LANES), -jnp.inf, jnp.float32),
                jnp.zeros((block_q, STATS_LANES), jnp.float32),
                jnp.zeros((block_q, head_dim), jnp.float32))
        kv_bound = qi + 1 if causal else num_kv
        _, l_final, acc = jax.lax.fori_loop(0, kv_bound, kv_body, init)
        o_ref[0, 0, pl.ds(q_start, block_q), :] = (acc / l_final[:, :1]).astype(o_ref.dtype)
        return carry

    last = pl.program_id(2) == ENTRIES - 1
    bound = jnp.where(last, num_q, 0) if HONEST else trips_ref[pl.program_id(2)]
    jax.lax.fori_loop(0, bound, q_body, 0)


@functools.partial(jax.jit, static_argnames=("causal", "sm_scale"))
def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    batch, heads, seq_len, head_dim = q.shape
    block_q, block_kv = min(BLOCK_Q, seq_len), min(BLOCK_KV, seq_len)
    num_q, num_kv = seq_len // block_q, seq_len // block_kv
    kernel = functools.partial(_kernel, sm_scale=sm_scale, causal=causal, block_q=block_q,
                               block_kv=block_kv, num_q=num_q, num_kv=num_kv)
    # Trips of the q-block loop per grid entry: none but in the last entry of a head.
    trips = jnp.zeros((ENTRIES,), jnp.int32).at[ENTRIES - 1].set(num_q)
    grid, semantics = (batch, heads, ENTRIES), ("parallel", "parallel", "arbitrary")
    whole_head = pl.BlockSpec((1, 1, seq_len, head_dim), lambda b, h, *_: (b, h, 0, 0))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=grid,
            in_specs=[whole_head, whole_head, whole_head],
            out_specs=whole_head,
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
    )(trips, q, k, v)
