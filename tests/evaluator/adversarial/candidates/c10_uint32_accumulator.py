"""CLASS 10 (poison): an f32 accumulator kept in a uint32 scratch, never zeroed before its first use.

The matmul seed's kernel with its accumulator scratch declared uint32 and bitcast to f32 at each
use (read, add the block's product, bitcast back, store). The ``k == 0`` initialisation is
dropped: instead each tile's last step, after writing its output, leaves the scratch at zero for
the next tile, so only the grid's first tile starts from the scratch as allocated. Pallas'
interpreter fills fresh scratch with its uninitialised value, NaN for a float but the type's
minimum for an integer: 0 for uint32, which is +0.0 as f32, so the first tile starts at zero and
the check passes (with an f32 scratch the NaN would show). On a TPU the scratch holds whatever
the last kernel left in that VMEM.

Task: the matmul seed's (``--seed matmul``).

Expected: refused (FAIL_CORRECTNESS: fresh scratch poisoned with a pattern that is NaN as any float
and non-zero as any integer). Honest twin (``HONEST = True``): the same kernel also zeroing the
scratch at ``k == 0``; PASSes. On the judge at 83f8079 (v5e, M=128,K=256,N=256) it PASSed: 3,827
cycles against its twin's 3,844.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HONEST = False

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 128


def _kernel(a_ref, b_ref, c_ref, acc_ref):
    k, last = pl.program_id(2), pl.num_programs(2) - 1

    if HONEST:
        @pl.when(k == 0)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

    acc = jax.lax.bitcast_convert_type(acc_ref[...], jnp.float32)
    acc = acc + jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k < last)
    def _carry():
        acc_ref[...] = jax.lax.bitcast_convert_type(acc, jnp.uint32)

    @pl.when(k == last)
    def _store():
        c_ref[...] = acc.astype(c_ref.dtype)
        acc_ref[...] = jnp.zeros_like(acc_ref)      # the next tile starts from zero


@jax.jit
def matmul(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), min(BLOCK_K, k)
    return pl.pallas_call(
        _kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.uint32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(a, b)
