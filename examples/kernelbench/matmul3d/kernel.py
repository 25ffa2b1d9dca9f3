"""A Pallas kernel for reference.py as an LLM might write it: the 3-D input folded into rows
(a block that tiles a reshaped input), a K loop in an f32 scratch, the blocks keyword defaults."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def matmul_kernel(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def tiled_matmul(a, b, block_m=128, block_n=128, block_k=256):
    rows, k = a.shape
    n = b.shape[1]
    return pl.pallas_call(
        matmul_kernel,
        grid=(rows // block_m, n // block_n, k // block_k),
        in_specs=[pl.BlockSpec((block_m, block_k), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((block_k, block_n), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((rows, n), a.dtype),
        scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],
    )(a, b)


class Model:
    def __init__(self):
        pass

    def forward(self, A, B):
        n, m, k = A.shape
        out = tiled_matmul(A.reshape(n * m, k), B)
        return out.reshape(n, m, B.shape[1])


N = 16
M = 1024
K = 2048
L = 768


def get_inputs():
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    return [jax.random.normal(ka, (N, M, K)), jax.random.normal(kb, (K, L))]


def get_init_inputs():
    return []
