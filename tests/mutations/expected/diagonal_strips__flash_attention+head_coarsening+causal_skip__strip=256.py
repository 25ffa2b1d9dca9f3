"""The naive starting candidate: a Pallas TPU flash attention that leaves room to improve.

Deliberately plain, so that the mutation operators have something to do:

* the grid is (batch, head, q block, kv block) and each program handles one head;
* the running max ``m`` and running sum ``l`` live in ``(BLOCK_Q, 128)`` f32 scratch, every
  lane holding the same value (the layout JAX's own kernel uses);
* the accumulator is re-normalised on every kv step;
* causal attention is handled by masking alone: no block is skipped, no DMA is saved.

The judge calls ``flash_attention(q, k, v, causal=..., sm_scale=...)`` on ``(B, H, N, D)`` arrays.
The tunables below are plain module-level constants so that a source rewrite can find them.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Tunables.
BLOCK_Q = 128
BLOCK_KV = 128
HEADS_PER_PROGRAM = 2
DIAGONAL_STRIP = 256  # rows per strip of a causal diagonal block (diagonal_strips)

# Lanes of the running-statistics scratch: one vreg row of 128 lanes per query row.
STATS_LANES = 128
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _flash_kernel(q_ref, k_ref, v_ref, o_ref, m_scratch, l_scratch, acc_scratch, *,
                  sm_scale, causal, block_q, block_kv, heads_per_program, head_dim):
    q_index = pl.program_id(2)
    kv_index = pl.program_id(3)

    @pl.when(kv_index == 0)
    def _init():
        m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    def _step(needs_mask, row0=0, *, q_ref=q_ref, k_ref=k_ref, v_ref=v_ref, m_scratch=m_scratch, l_scratch=l_scratch, acc_scratch=acc_scratch):
        for head in range(heads_per_program):
            q = q_ref[head][0, 0]
            k = k_ref[head][0, 0]
            v = v_ref[head][0, 0]
            s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32)
            s = s * sm_scale
            if needs_mask:
                rows = row0 + q_index * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
                cols = kv_index * block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
                s = jnp.where(cols <= rows, s, MASK_VALUE)

            m_prev = m_scratch[head]
            l_prev = l_scratch[head]
            m_curr = jnp.max(s, axis=1, keepdims=True)
            m_next = jnp.maximum(m_prev, m_curr)
            alpha = jnp.exp(m_prev - m_next)
            p = jnp.exp(s - m_next[:, :1])
            l_corr = alpha * l_prev
            l_next = l_corr + jnp.sum(p, axis=1, keepdims=True)
            m_scratch[head] = m_next
            l_scratch[head] = l_next

            # Keep the accumulator normalised after every kv step.
            l_next_inv = 1.0 / l_next
            pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)
            acc_scratch[head] = (acc_scratch[head] * (l_corr * l_next_inv)[:, :1]
                                + pv * l_next_inv[:, :1])

    def _diagonal_strips(strip):
        # Rows [a*strip, (a+1)*strip) of a diagonal block see kv columns [0, (a+1)*strip) only.
        for a in range(block_q // strip):
            rows = pl.ds(a * strip, strip)
            seen = pl.ds(0, (a + 1) * strip)
            _step(True, row0=a * strip,
                  q_ref=tuple(t.at[:, :, rows, :] for t in q_ref),
                  k_ref=tuple(t.at[:, :, seen, :] for t in k_ref),
                  v_ref=tuple(t.at[:, :, seen, :] for t in v_ref),
                  m_scratch=m_scratch.at[:, rows, :],
                  l_scratch=l_scratch.at[:, rows, :],
                  acc_scratch=acc_scratch.at[:, rows, :])

    if causal:
        # Causal block skipping: kv blocks entirely above the diagonal do no work (their K/V
        # index is clamped in the index map, so no DMA either); only blocks that straddle the
        # diagonal pay for the mask.
        q_first = q_index * block_q
        kv_first = kv_index * block_kv
        kv_last = kv_first + block_kv - 1

        @pl.when(kv_last <= q_first)
        def _below_diagonal():
            _step(False)

        @pl.when(jnp.logical_and(kv_first < q_first + block_q, kv_last > q_first))
        def _on_diagonal():
            if block_q == block_kv and block_q % DIAGONAL_STRIP == 0 and block_q > DIAGONAL_STRIP:
                _diagonal_strips(DIAGONAL_STRIP)
            else:
                _step(True)
    else:
        _step(False)


    @pl.when(kv_index == pl.num_programs(3) - 1)
    def _store():
        for head in range(heads_per_program):
            lanes = pl.ds(head * head_dim, head_dim)  # this head's lanes
            o_ref[0, 0, :, lanes] = acc_scratch[head].astype(o_ref.dtype)


def _lanes_to_heads(x, heads_per_program):
    """(B, H // hpp, N, hpp * D), each program's heads side by side along lanes -> (B, H, N, D)."""
    batch, groups, seq_len, lanes = x.shape
    x = x.reshape(batch, groups, seq_len, heads_per_program, lanes // heads_per_program)
    return x.transpose(0, 1, 3, 2, 4).reshape(
        batch, groups * heads_per_program, seq_len, lanes // heads_per_program)


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
    heads_per_program = HEADS_PER_PROGRAM
    if heads % heads_per_program:
        raise ValueError(f"{heads} heads is not a multiple of HEADS_PER_PROGRAM={heads_per_program}")
    grid = (batch, heads // heads_per_program, seq_len // block_q, seq_len // block_kv)
    kernel = functools.partial(_flash_kernel, sm_scale=sm_scale, causal=causal,
                               block_q=block_q, block_kv=block_kv,
                               heads_per_program=heads_per_program,
                               head_dim=head_dim)

    def kv_block_index(i, j):
        # Causal: kv blocks past the diagonal map to the last block that q block i needs, so the
        # pipeline sees an unchanged block index and issues no DMA for them.
        if causal:
            return jnp.minimum(j, jax.lax.div((i + 1) * block_q - 1, block_kv))
        return j

    out = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[
            tuple(pl.BlockSpec((1, 1, block_q, head_dim), lambda b, h, i, j, t=t: (b, h * heads_per_program + t, i, 0)) for t in range(heads_per_program)),
            tuple(pl.BlockSpec((1, 1, block_kv, head_dim), lambda b, h, i, j, t=t: (b, h * heads_per_program + t, kv_block_index(i, j), 0)) for t in range(heads_per_program)),
            tuple(pl.BlockSpec((1, 1, block_kv, head_dim), lambda b, h, i, j, t=t: (b, h * heads_per_program + t, kv_block_index(i, j), 0)) for t in range(heads_per_program)),
        ],
        out_specs=pl.BlockSpec((1, 1, block_q, heads_per_program * head_dim), lambda b, h, i, j: (b, h, i, 0)),
        out_shape=jax.ShapeDtypeStruct((q.shape[0], q.shape[1] // heads_per_program, q.shape[2], heads_per_program * q.shape[3]), q.dtype),
        scratch_shapes=[
            pltpu.VMEM((heads_per_program, block_q, STATS_LANES), jnp.float32),
            pltpu.VMEM((heads_per_program, block_q, STATS_LANES), jnp.float32),
            pltpu.VMEM((heads_per_program, block_q, head_dim), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )((q,) * heads_per_program, (k,) * heads_per_program, (v,) * heads_per_program)
    return _lanes_to_heads(out, heads_per_program)
