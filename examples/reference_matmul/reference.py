"""A reference file: the whole task for `evolve ... --reference examples/reference_matmul/reference.py`.

gelu(x @ w + b) in bf16 at 4096^3: what the kernel beside it (kernel.py) must compute, and the
XLA program it must beat.
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 4096, 4096


def create_inputs():
    kx, kw, kb = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (M, K), jnp.bfloat16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) / K**0.5).astype(jnp.bfloat16)
    b = jax.random.normal(kb, (1, N), jnp.bfloat16)
    return x, w, b


def workload(x, w, b):
    y = jnp.dot(x, w, preferred_element_type=jnp.float32) + b.astype(jnp.float32)
    return jax.nn.gelu(y).astype(x.dtype)
