"""The check computes every dot as the TPU's MXU does (``evaluator/correctness/precision.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from evaluator.correctness import precision

P = jax.lax.Precision


@pytest.mark.parametrize("stated, dtypes, n", [
    (None, ("float32", "float32"), 1), (P.DEFAULT, ("float32", "float32"), 1),
    (P.HIGH, ("float32", "float32"), 3), (P.HIGHEST, ("float32", "float32"), precision.EXACT),
    ((P.DEFAULT, P.HIGHEST), ("float32", "float32"), precision.EXACT),
    (None, ("bfloat16", "float32"), 1), (None, ("bfloat16", "bfloat16"), precision.EXACT),
    (jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X3, ("float32", "float32"), 3),
    (jax.lax.DotAlgorithmPreset.F32_F32_F32, ("float32", "float32"), precision.EXACT),
])
def test_passes_follow_the_stated_precision_and_the_operand_types(stated, dtypes, n):
    assert precision.passes(stated, *dtypes) == n


def _error(stated) -> float:
    a = jax.random.normal(jax.random.key(0), (128, 256), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (256, 128), jnp.float32)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    with precision.installed():
        out = jax.jit(lambda a, b: jnp.dot(a, b, precision=stated))(a, b)
    return float(np.abs(np.asarray(out, np.float64) - exact).max())


def test_one_pass_three_passes_and_f32_differ_as_on_the_chip():
    one, three, six = _error(None), _error(P.HIGH), _error(P.HIGHEST)
    assert one > 30 * three > 0         # bf16 operands: ~2^-9 relative per product
    assert three > six                  # hi*hi + hi*lo + lo*hi drops lo*lo
    assert six < 1e-4                   # f32


def test_the_cpu_computes_f32_again_outside_the_block():
    a = jax.random.normal(jax.random.key(2), (64, 64), jnp.float32)
    b = jax.random.normal(jax.random.key(3), (64, 64), jnp.float32)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    with precision.installed():
        inside = jax.jit(lambda a, b: jnp.dot(a, b) * 1.0)(a, b)
    outside = jax.jit(lambda a, b: jnp.dot(a, b) * 2.0)(a, b) / 2.0
    assert np.abs(np.asarray(inside) - exact).max() > 10 * np.abs(np.asarray(outside) - exact).max()


def test_a_kernels_reduced_dot_is_named():
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...]).astype(o_ref.dtype)

    def fn(a, b):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), a.dtype))(a, b)

    spec = jax.ShapeDtypeStruct((8, 128), jnp.float32), jax.ShapeDtypeStruct((128, 128), jnp.float32)
    found = precision.reduced_dots(jax.make_jaxpr(fn)(*spec).jaxpr)
    assert found == ["float32[8,128] x float32[128,128] at precision None (one bf16 pass on the TPU)"]
    bf16 = jax.ShapeDtypeStruct((8, 128), jnp.bfloat16), jax.ShapeDtypeStruct((128, 128), jnp.bfloat16)
    assert precision.reduced_dots(jax.make_jaxpr(fn)(*bf16).jaxpr) == []
