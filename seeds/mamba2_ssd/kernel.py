"""A chunked (state-passing) Pallas kernel of Mamba-2's SSD: a grid over (batch x head); each
program holds its head's C, B, x (the sequence on lanes: (features, S), the layout XLA gives such
arrays, so no copy before or after) and walks the sequence in chunks of CHUNK tokens, carrying two
decayed sums in f32 from chunk to chunk: of x_j b_j^T (a P x N state) and of b_j (the row sums').

Why it is the matrix form: with cs = cumsum(log(sigmoid(A_log) + 1e-8)) (computed before the
kernel as the reference computes it; it never increases) and A the cs of the token before the
chunk, a query i of the chunk receives from every earlier key j
exp(cs[i] - cs[j]) (c_i . b_j) x_j = exp(cs[i] - A) * [exp(A - cs[j]) x_j b_j^T] c_i, both factors
at most 1; the bracket summed over the earlier chunks is the state. Keys inside the chunk take the
causal block (C B^T * exp(cs[i] - cs[j])) x as the matrix form does. The signed row sums ride
along the same way, and each row is divided by max(|row sum|, 1) at the end. The elementwise work
is S x CHUNK per head instead of S^2 / 2, and the MXU's S x CHUNK x (N + P) plus S x N x P.

f32 operands reach the MXU in PASSES bf16 passes: 2 adds their low 16 bits (split by bitcast
and mask) as a second pass.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 256
# the tokens each step of the walk takes; no block shape holds it, so the search is told its values
TUNE = {"CHUNK": [128, 256, 512]}
PASSES = 2          # bf16 passes of an f32 operand on the MXU: 2 adds its low 16 bits


def _parts(a, dtype):
    """``a`` (f32) as PASSES bf16 parts whose sum is ``a`` to f32 (one part: ``a`` rounded)."""
    if PASSES > 1:
        bits = jax.lax.bitcast_convert_type(a, jnp.uint32) & jnp.uint32(0xFFFF0000)
        high = jax.lax.bitcast_convert_type(bits, jnp.float32)
        return [high.astype(dtype), (a - high).astype(dtype)]
    return [a.astype(dtype)]


def _dot(a, b, dims, f32_side):
    """dot_general with the f32 operand (``f32_side`` 0 or 1) in PASSES bf16 passes."""
    dims = (dims, ((), ()))
    if f32_side == 0:
        pairs = [(p, b) for p in _parts(a, b.dtype)]
    else:
        pairs = [(a, p) for p in _parts(b, a.dtype)]
    return functools.reduce(jnp.add, [jax.lax.dot_general(lhs, rhs, dims, preferred_element_type=jnp.float32)
                                      for lhs, rhs in pairs])


def _kernel(c_ref, b_ref, x_ref, row_ref, o_ref, *, chunk):
    n, s_len = c_ref.shape
    p = x_ref.shape[0]
    upper = (jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)      # key j (sublanes)
             <= jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1))  # query i (lanes)
    state = jnp.zeros((p, n), jnp.float32)       # decayed sum of x_j b_j^T before the chunk
    sums = jnp.zeros((n, 1), jnp.float32)        # decayed sum of b_j before the chunk
    anchor = row_ref[0:1, 0:1]
    cols = row_ref[...].T
    for k in range(s_len // chunk):
        lanes = slice(k * chunk, (k + 1) * chunk)
        c, b, x = c_ref[:, lanes], b_ref[:, lanes], x_ref[:, lanes]      # (n|p, chunk) bf16
        row = row_ref[k:k + 1, :]                                        # cs of the chunk, (1, chunk)
        col = cols[:, k:k + 1]                                           # the same, (chunk, 1)
        st = jax.lax.dot_general(b, c, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        st = st * jnp.exp(jnp.where(upper, row - col, -jnp.inf))        # (key j, query i)
        into = jnp.exp(row - anchor)                                     # exp(cs[i] - A), (1, chunk)
        acc = _dot(x, st, ((1,), (0,)), 1) + into * _dot(state, c, ((1,), (0,)), 0)
        total = (jnp.sum(st, axis=0, keepdims=True)
                 + into * jnp.sum(sums * c.astype(jnp.float32), axis=0, keepdims=True))
        total = jnp.where(jnp.abs(total) < 1e-6, 1.0, total)
        o_ref[:, lanes] = (acc / jnp.maximum(jnp.abs(total), 1.0)).astype(o_ref.dtype)
        last = row[:, chunk - 1:chunk]
        wb = jnp.exp(last - row) * b.astype(jnp.float32)                 # exp(cs_last - cs[j]) b_j
        carry = jnp.exp(last - anchor)
        state = carry * state + _dot(x, wb, ((1,), (1,)), 1)
        sums = carry * sums + jnp.sum(wb, axis=1, keepdims=True)
        anchor = last


@jax.jit
def ssd(c, b, x, a_log):
    bsz, h, s, n = c.shape
    p = x.shape[3]
    chunk = min(CHUNK, s)
    if s % chunk:
        raise ValueError(f"sequence length {s} is not a multiple of CHUNK={chunk}")
    cs = jnp.cumsum(jnp.log(jax.nn.sigmoid(a_log.astype(jnp.float32)) + 1e-8), axis=-1)
    heads, k = bsz * h, s // chunk

    def whole(rows, width):
        return pl.BlockSpec((None, rows, width), lambda bh: (bh, 0, 0))

    def lanes(a):        # (B, H, S, W) -> (B*H, W, S): the sequence on lanes
        return a.reshape(heads, s, a.shape[3]).transpose(0, 2, 1)

    out = pl.pallas_call(
        functools.partial(_kernel, chunk=chunk),
        grid=(heads,),
        in_specs=[whole(n, s), whole(n, s), whole(p, s), whole(k, chunk)],
        out_specs=whole(p, s),
        out_shape=jax.ShapeDtypeStruct((heads, p, s), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=48 << 20),
    )(lanes(c), lanes(b), lanes(x), cs.reshape(heads, k, chunk))
    return out.transpose(0, 2, 1).reshape(bsz, h, s, p)
