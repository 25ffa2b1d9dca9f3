"""A Pallas MLA (DeepSeek-V3 multi-head latent attention) in the latent (absorbed) form.

The projections run as XLA dots in the wrapper: x -> c_q -> the heads' nope queries and rope
queries (two dots on q_up's columns), x -> the kv latent c_kv and the shared rope key. Rotary
embedding is applied there in f32, in the half-rotated order (a permutation of the rope lanes,
the same for queries and keys, so every score is unchanged), and the softmax scale is folded into
the queries.

The kernel runs over (batch, head block, q block) with a loop over key blocks, and attends over
the latent: every head's score is q_nope W_uk^T c_kv + q_rope k_rope, one shared 576-wide key
(c_kv | k_rope) for all heads (MQA over the latent), and its value is c_kv itself, W_uv applied
after the softmax. At the first key block the kernel absorbs W_uk into its heads' queries
(HEADS_PER_BLOCK heads' (BLOCK_Q, 512) latent queries, stacked as rows of one matmul); the online
softmax keeps f32 statistics and an f32 (rows, 512) accumulator; key blocks past the causal
diagonal are neither fetched nor computed; at the last key block it applies W_uv per head and
writes the heads' values in the (B, S, H * v) layout the output projection reads.

The latent form trades the k_up and v_up projections' materialised keys and values for wider
attention: 1088 MACs per (query, key) pair and head instead of 320. At DeepSeek-V3's prefill
(S=2048) that is 5.40 TFLOP against the plain form's 3.75 (useful, causal): the form pays off
for decode and long caches, where reading the keys is the cost.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Tunables.
BLOCK_Q = 256
BLOCK_K = 512
HEADS_PER_BLOCK = 4
# Their values (the wrapper caps each at its dimension): the key block and the heads tile arrays
# the wrapper makes, which discovery cannot size; HEADS_PER_BLOCK * nope stays a multiple of 128.
TUNE = {"BLOCK_Q": [64, 128, 256, 512, 1024], "BLOCK_K": [128, 256, 512, 1024, 2048],
        "HEADS_PER_BLOCK": [2, 4, 8, 16]}

ROPE_THETA = 10000.0
MASK_VALUE = -1e9          # the workload's own masked score
STATS_LANES = 128          # running max and sum: one 128-lane row per query row


def _mla_kernel(qn_ref, qr_ref, wk_ref, k_ref, wv_ref, o_ref, q_scr, m_scr, l_scr, acc_scr, *,
                heads, block_q, block_k, nope, kvl, vd, scale):
    i, j = pl.program_id(2), pl.program_id(3)
    rows = heads * block_q

    @pl.when(j == 0)
    def _init():
        for h in range(heads):          # absorb W_uk: the latent query of each head
            latent = jax.lax.dot_general(qn_ref[0, :, h * nope:(h + 1) * nope], wk_ref[:, h * nope:(h + 1) * nope],
                                         (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            q_scr[h * block_q:(h + 1) * block_q, :kvl] = (latent * scale).astype(q_scr.dtype)
            q_scr[h * block_q:(h + 1) * block_q, kvl:] = qr_ref[0, h]
        m_scr[...] = jnp.full(m_scr.shape, -jnp.inf, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    def attend(masked):
        k = k_ref[0]
        s = jax.lax.dot_general(q_scr[...], k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        if masked:
            s = s.reshape(heads, block_q, block_k)
            row = i * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            col = j * block_k + jax.lax.broadcasted_iota(jnp.int32, s.shape, 2)
            s = jnp.where(col <= row, s, MASK_VALUE).reshape(rows, block_k)
        m_prev = m_scr[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, :1])
        l_scr[...] = alpha * l_scr[...] + jnp.sum(p, axis=1, keepdims=True)
        m_scr[...] = m_next
        pv = jnp.dot(p.astype(k.dtype), k[:, :kvl], preferred_element_type=jnp.float32)
        acc_scr[...] = acc_scr[...] * alpha[:, :1] + pv

    first_row, last_row = i * block_q, (i + 1) * block_q - 1
    first_col, last_col = j * block_k, (j + 1) * block_k - 1

    @pl.when(last_col <= first_row)             # below the diagonal: every key visible
    def _full():
        attend(False)

    @pl.when(jnp.logical_and(last_col > first_row, first_col <= last_row))   # on it: masked
    def _diagonal():
        attend(True)

    @pl.when(j == pl.num_programs(3) - 1)
    def _store():
        latent = (acc_scr[...] / l_scr[:, :1]).astype(wv_ref.dtype)
        for h in range(heads):          # W_uv after the softmax
            out = jnp.dot(latent[h * block_q:(h + 1) * block_q], wv_ref[:, h * vd:(h + 1) * vd],
                          preferred_element_type=jnp.float32)
            o_ref[0, :, h * vd:(h + 1) * vd] = out.astype(o_ref.dtype)


def _table_kernel(cos_ref, sin_ref, *, theta, rope):
    shape = cos_ref.shape
    position = jax.lax.broadcasted_iota(jnp.int32, shape, 0).astype(jnp.float32)
    pair = jax.lax.broadcasted_iota(jnp.int32, shape, 1).astype(jnp.float32)
    angle = position / jnp.exp(pair * (2.0 * math.log(theta) / rope))      # position / theta^(2k/rope)
    cos_ref[...] = jnp.cos(angle)
    sin_ref[...] = jnp.sin(angle)


def _rope_table(seq, rope, theta):
    """cos and sin of the rotary angles, (seq, rope // 2) f32, made in a kernel (not folded by XLA)."""
    table = jax.ShapeDtypeStruct((seq, rope // 2), jnp.float32)
    return pl.pallas_call(functools.partial(_table_kernel, theta=theta, rope=rope), out_shape=(table, table))()


def _rope(x, cos, sin):
    """Rotary embedding of x's last axis in f32, its interleaved pairs written half-rotated
    (evens' rotations, then odds')."""
    x = x.astype(jnp.float32)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


@jax.jit
def mla(x, q_down_proj, q_up_proj, kv_down_proj, k_up_proj, v_up_proj, o_proj):
    batch, seq, _ = x.shape
    kvl = k_up_proj.shape[0]
    rope = kv_down_proj.shape[1] - kvl
    heads = (q_up_proj.shape[1] - k_up_proj.shape[1]) // rope
    nope, vd = k_up_proj.shape[1] // heads, v_up_proj.shape[1] // heads
    scale = (nope + rope) ** -0.5
    hb, bq, bk = min(HEADS_PER_BLOCK, heads), min(BLOCK_Q, seq), min(BLOCK_K, seq)
    if heads % hb or seq % bq or seq % bk:
        raise ValueError(f"heads {heads} and sequence {seq} must be multiples of HEADS_PER_BLOCK={hb}, "
                         f"BLOCK_Q={bq} and BLOCK_K={bk}")
    cos, sin = _rope_table(seq, rope, ROPE_THETA)

    # Projections (XLA): the queries' nope and rope parts from q_up's columns, the latent and rope key.
    c_q = jnp.dot(x, q_down_proj)
    w_q = q_up_proj.reshape(-1, heads, nope + rope)
    q_nope = jnp.dot(c_q, w_q[:, :, :nope].reshape(-1, heads * nope))                  # (B, S, H*nope)
    q_rope = jnp.einsum("bsc,chr->bhsr", c_q, w_q[:, :, nope:])                         # (B, H, S, rope)
    q_rope = (_rope(q_rope, cos, sin) * scale).astype(x.dtype)
    kv = jnp.dot(x, kv_down_proj)
    keys = jnp.concatenate([kv[..., :kvl], _rope(kv[..., kvl:], cos, sin).astype(x.dtype)],
                           axis=-1)                                                    # (B, S, kvl + rope)

    def key_block(b, g, i, j):          # past the diagonal: the last block needed again, no new DMA
        return b, jnp.minimum(j, ((i + 1) * bq - 1) // bk), 0

    kernel = functools.partial(_mla_kernel, heads=hb, block_q=bq, block_k=bk, nope=nope, kvl=kvl, vd=vd,
                               scale=scale)
    values = pl.pallas_call(
        kernel,
        grid=(batch, heads // hb, seq // bq, seq // bk),
        in_specs=[
            pl.BlockSpec((1, bq, hb * nope), lambda b, g, i, j: (b, i, g)),
            pl.BlockSpec((1, hb, bq, rope), lambda b, g, i, j: (b, g, i, 0)),
            pl.BlockSpec((kvl, hb * nope), lambda b, g, i, j: (0, g)),
            pl.BlockSpec((1, bk, kvl + rope), key_block),
            pl.BlockSpec((kvl, hb * vd), lambda b, g, i, j: (0, g)),
        ],
        out_specs=pl.BlockSpec((1, bq, hb * vd), lambda b, g, i, j: (b, i, g)),
        out_shape=jax.ShapeDtypeStruct((batch, seq, heads * vd), x.dtype),
        scratch_shapes=[
            pltpu.VMEM((hb * bq, kvl + rope), x.dtype),
            pltpu.VMEM((hb * bq, STATS_LANES), jnp.float32),
            pltpu.VMEM((hb * bq, STATS_LANES), jnp.float32),
            pltpu.VMEM((hb * bq, kvl), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(q_nope, q_rope, k_up_proj, keys, v_up_proj)
    return jnp.dot(values, o_proj)
