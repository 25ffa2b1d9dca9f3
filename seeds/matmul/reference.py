"""C = A @ B in bf16 with f32 accumulation (M = N = K = 4096 by default; --shape M=8,K=4096,N=14336 for decode)."""

import jax
import jax.numpy as jnp

SMALL = "M=128,K=256,N=256"     # the shape the tests run it at
SIGNATURE = "a: bf16[M,K], b: bf16[K,N]"     # what the kernel takes (seeds/signature.py)


def create_inputs(M=4096, K=4096, N=4096):
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (M, K), jnp.bfloat16)
    b = (jax.random.normal(kb, (K, N), jnp.float32) / K**0.5).astype(jnp.bfloat16)
    return a, b


def workload(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
