"""C = A @ B in f32, f32 in and out, at full f32 precision (class 10's task for the one-pass f32 dot)."""

import jax
import jax.numpy as jnp

SMALL = "M=256,K=256,N=256"     # the shape the tests run it at


def create_inputs(M=1024, K=1024, N=1024):
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (M, K), jnp.float32)
    b = jax.random.normal(kb, (K, N), jnp.float32) / K**0.5
    return a, b


def workload(a, b):
    return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)
