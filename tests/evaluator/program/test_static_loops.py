"""The runner unrolls XLA loops of a constant trip count around the kernels, so that the estimate
counts every trip (``static_loops.py``); loops inside kernels, loops of data, and long loops stay."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from evaluator.program.jaxpr_tools import find
from evaluator.program.static_loops import MAX_TRIPS, unroll_static

X = jnp.ones((8, 128), jnp.float32)


def _scans(closed):
    found = find(closed.jaxpr, lambda e: e.primitive.name == "scan")
    return [(e.params["length"], e.params["unroll"]) for _, e in found]


def _double(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.fori_loop(0, 3, lambda i, a: a + x_ref[...], jnp.zeros_like(x_ref[...]))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)


def _lowered(closed) -> str:
    return jax.jit(functools.partial(jax.core.eval_jaxpr, closed.jaxpr, closed.consts)).lower(X).as_text()


def test_a_constant_loop_around_the_kernel_is_unrolled_and_computes_the_same():
    closed = jax.make_jaxpr(lambda x: jax.lax.fori_loop(0, 4, lambda i, a: _double(a) * 0.5, x))(X)
    unrolled = unroll_static(closed)
    assert _scans(closed) == [(4, 1), (3, 1)] and _scans(unrolled) == [(4, 4), (3, 1)]   # the kernel's stays
    out = jax.core.eval_jaxpr(unrolled.jaxpr, unrolled.consts, X)[0]
    assert jnp.array_equal(out, jax.core.eval_jaxpr(closed.jaxpr, closed.consts, X)[0])


def test_unrolled_the_program_has_no_xla_loop_left():
    closed = jax.make_jaxpr(lambda x: jax.lax.fori_loop(0, 4, lambda i, a: jnp.sin(a) * i, x))(X)
    assert "stablehlo.while" in _lowered(closed) and "stablehlo.while" not in _lowered(unroll_static(closed))


def test_loops_of_data_long_loops_and_loops_inside_loops_stay():
    of_data = jax.make_jaxpr(lambda x: jax.lax.fori_loop(0, x[0, 0].astype(jnp.int32), lambda i, a: a * 2, x))(X)
    long = jax.make_jaxpr(lambda x: jax.lax.fori_loop(0, MAX_TRIPS + 1, lambda i, a: a * 2, x))(X)
    nested = jax.make_jaxpr(lambda x: jax.lax.while_loop(
        lambda a: a[0, 0] < 100, lambda a: jax.lax.fori_loop(0, 2, lambda i, b: b * 2, a), x))(X)
    for closed in (of_data, long, nested):
        assert unroll_static(closed) is closed


def test_a_loop_inside_a_jit_is_unrolled():
    inner = jax.jit(lambda x: jax.lax.fori_loop(0, 2, lambda i, a: a * 2, x))
    closed = jax.make_jaxpr(lambda x: inner(x) + 1)(X)
    assert _scans(unroll_static(closed)) == [(2, 2)]
