"""CLASS 10 (DMAs): a matmul that reads its own DMA's destination before waiting for it.

The matmul seed's kernel with B left in HBM (``memory_space=pl.ANY``) and copied by the kernel:
each grid step starts a DMA of its (bk, bn) block of B into a VMEM scratch, and, to overlap the
copy with the MXU, computes the block's product from that scratch before waiting on the copy.
Pallas' interpreter performs a copy in full at ``start()``, so the product it checks reads complete
data; on a TPU the dot reads a buffer the DMA is still filling (last step's block, or part of this
one's).

Task: the matmul seed's (``--seed matmul``).

Expected: refused (FAIL_CORRECTNESS: a DMA's destination reads as poison, NaN, until its wait).
Honest twin (``HONEST = True``): the same copy, waited for before the dot; PASSes. On the judge
at 83f8079 (v5e, M=128,K=256,N=256) it PASSed: 6,916 cycles against its twin's 7,696 (the copy
overlapping the dot in the estimate).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HONEST = False

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 128


def _kernel(a_ref, b_hbm, c_ref, b_buf, acc_ref, sem, *, block_k, block_n):
    j, kk = pl.program_id(1), pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    rows = pl.ds(pl.multiple_of(kk * block_k, block_k), block_k)
    cols = pl.ds(pl.multiple_of(j * block_n, block_n), block_n)
    copy = pltpu.make_async_copy(b_hbm.at[rows, cols], b_buf, sem.at[0])
    copy.start()
    if HONEST:
        copy.wait()
    acc_ref[...] += jnp.dot(a_ref[...], b_buf[...], preferred_element_type=jnp.float32)
    if not HONEST:
        copy.wait()

    @pl.when(kk == pl.num_programs(2) - 1)
    def _store():
        c_ref[...] = acc_ref[...].astype(c_ref.dtype)


@jax.jit
def matmul(a, b):
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), min(BLOCK_K, k)
    kernel = functools.partial(_kernel, block_k=bk, block_n=bn)
    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((bk, bn), b.dtype), pltpu.VMEM((bm, bn), jnp.float32),
                        pltpu.SemaphoreType.DMA((1,))],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(a, b)
