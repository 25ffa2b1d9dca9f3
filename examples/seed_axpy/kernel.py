"""The starting candidate of the axpy example seed: out = alpha * x + y, a block of rows per program."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_ROWS = 8   # rows per program; the task declares the legal values, block_sizes moves it


def _axpy_kernel(x_ref, y_ref, o_ref, *, alpha):
    x = x_ref[...].astype(jnp.float32)
    y = y_ref[...].astype(jnp.float32)
    o_ref[...] = (alpha * x + y).astype(o_ref.dtype)


def axpy(x, y, *, alpha):
    rows, cols = x.shape
    block = min(BLOCK_ROWS, rows)
    spec = pl.BlockSpec((block, cols), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_axpy_kernel, alpha=alpha),
        grid=(rows // block,),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, y)
