"""CLASS 10 (cores): the matmul seed's kernel with its K (reduction) axis marked "parallel".

On a chip with two TensorCores (``--chip v5p``) Mosaic splits a "parallel" grid axis between the
cores. Here the K axis is the one split: each core runs half of the K steps with its own
accumulator scratch, the second core never runs the ``k == 0`` initialisation, and both write the
one output tile: wrong on the chip. At a shape whose M and N fit one block each (the K axis the
only one with more than one step), the estimate counts half the steps per core, cutting about 40%
off the figure. The interpreter walks the grid in order on one set of scratch buffers, so the result
it checks is right.

Task: the matmul seed's (``--seed matmul --chip v5p``).

Expected: refused (FAIL_CORRECTNESS, each core's share run with its own poisoned scratch, or the
"parallel" axis that shares scratch and revisits its output block refused by name). Honest twin
(``HONEST = True``): the seed's own semantics, K "arbitrary"; PASSes. On the judge at 83f8079
(v5p, M=128,K=1024,N=128) it PASSed: 3,067 cycles against its twin's 4,927 (5,017 against 8,819 at
K=2048; at the seed's SMALL shape, M=128,K=256,N=256, both 2,048: the HBM floor).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HONEST = False

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 128

SEMANTICS = ("parallel", "parallel", "arbitrary" if HONEST else "parallel")


def _kernel(a_ref, b_ref, c_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        c_ref[...] = acc_ref[...].astype(c_ref.dtype)


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
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=SEMANTICS),
    )(a, b)
