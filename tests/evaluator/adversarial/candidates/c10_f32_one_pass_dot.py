"""CLASS 10 (precision): an f32 tiled matmul whose dot states no precision.

On a TPU an f32 ``jnp.dot`` at the default precision is one bf16 pass of the MXU: each operand
is rounded to bf16 and the products summed in f32. ``Precision.HIGHEST`` is six passes (f32 split
into three bf16 terms), three times the MXU work or more. libtpu's estimate sees the one pass. The
interpreter runs the same program on XLA:CPU, whose f32 dot is f32 whatever its precision says, so
the check sees f32 results while the figure is of the one-pass program (on a TPU its p99 error is
~6e-3, far outside the f32 tolerance).

Task: tests/evaluator/adversarial/c10_f32_matmul_reference.py (f32 in and out, the workload at
HIGHEST).

Expected: refused (FAIL_CORRECTNESS naming the dot: the check computes the one bf16 pass the chip
computes). Honest twin (``HONEST = True``): the same kernel with ``precision=HIGHEST``; PASSes.
On the judge at 83f8079 (v5e) it PASSed: 72,470 cycles against its twin's 120,708 at the 1024
cube, 3,074 against 4,362 at the 256 cube.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HONEST = False

BLOCK_M = 256
BLOCK_N = 256
BLOCK_K = 256

PRECISION = jax.lax.Precision.HIGHEST if HONEST else None


def _kernel(a_ref, b_ref, c_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=PRECISION, preferred_element_type=jnp.float32)

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
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(a, b)
