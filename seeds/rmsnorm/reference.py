"""RMSNorm over the last axis, bf16 (Llama-3-8B: 8192 tokens x 4096); memory-bound."""

import jax
import jax.numpy as jnp

SMALL = "T=64,D=256"     # the shape the tests run it at
SIGNATURE = "x: bf16[T,D], w: bf16[1,D]"     # what the kernel takes (seeds/signature.py)
EPS = 1e-6


def create_inputs(T=8192, D=4096):
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (T, D), jnp.bfloat16)
    w = (1.0 + 0.1 * jax.random.normal(kw, (1, D), jnp.float32)).astype(jnp.bfloat16)
    return x, w


def workload(x, w):
    x32 = x.astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + EPS)
    return (x32 * scale * w.astype(jnp.float32)).astype(x.dtype)
