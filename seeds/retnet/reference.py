"""RetNet multi-scale retention, bf16 (RetNet-6.7B: batch 4, 4096 tokens, 16 heads of 256): causal
(Q K^T * D) V with D[i,j] = gamma_h^(i-j), gamma_h = 1 - 2^(-5-h), each row's scores divided by
max(sum |scores|, 1) in f32 before the cast to bf16 (JAXBench's 15p_RetNet_Retention)."""

import jax.numpy as jnp
import numpy as np

SMALL = "B=1,H=1,S=2048,D=64"     # the shape the tests run it at (S past BLOCK_K: both loops run)
CHIP = "v6e"     # the JAXBench workloads are Autocomp's v6e figures
SIGNATURE = "q: bf16[B,H,S,D], k: bf16[B,H,S,D], v: bf16[B,H,S,D] -> bf16[B,H,S,D]"
UNITS = "B"     # batch rows are independent (not heads: the decay depends on the head's index)


def create_inputs(B=4, H=16, S=4096, D=256):
    rng = np.random.default_rng(0)        # numpy: 400 MB of inputs in seconds
    return tuple(rng.standard_normal((B, H, S, D), np.float32).astype(jnp.bfloat16) for _ in range(3))


def workload(q, k, v):
    _, h, s, _ = q.shape
    gammas = 1.0 - jnp.exp2(-5.0 - jnp.arange(h, dtype=jnp.float32))
    distance = jnp.arange(s, dtype=jnp.float32)[:, None] - jnp.arange(s, dtype=jnp.float32)[None, :]
    decay = jnp.exp(jnp.log(gammas)[:, None, None] * jnp.maximum(distance, 0.0)[None])
    decay = decay * (distance >= 0).astype(jnp.float32)[None]
    scores = jnp.einsum("bhsd,bhtd->bhst", q.astype(jnp.float32), k.astype(jnp.float32))
    scores = scores * decay[None]
    scores = scores / jnp.maximum(jnp.sum(jnp.abs(scores), axis=-1, keepdims=True), 1.0)
    return jnp.einsum("bhst,bhtd->bhsd", scores.astype(q.dtype), v)


def flops(q, k, v):
    """The causal half of both products (XLA's count is of the full S x S ones)."""
    b, h, s, d = q.shape
    return 2 * 2 * b * h * d * s * (s + 1) // 2
