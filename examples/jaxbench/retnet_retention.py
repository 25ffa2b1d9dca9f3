"""RetNet-6.7B's multi-scale retention as a user writes it in plain JAX, with no kernel: queries,
keys and values (batch, heads, tokens, head size), per-head decay 1 - 2^-(5+h) raised to the
distance, each row divided by the sum of its absolute decayed scores (at least one).

`evolve run --reference examples/jaxbench/retnet_retention.py --chip v6e` serves it with a seed
(docs/own-kernel.md); its defaults are the model's shape (batch 4, 4096 tokens, 16 heads of 256)."""

import jax.numpy as jnp
import numpy as np


def create_inputs(batch=4, tokens=4096, heads=16, head_size=256):
    gen = np.random.default_rng(42)
    shape = (batch, heads, tokens, head_size)
    return tuple(gen.standard_normal(shape, np.float32).astype(jnp.bfloat16) for _ in "qkv")


def workload(queries, keys, values):
    heads, tokens = queries.shape[1], queries.shape[2]
    decay_rate = 1.0 - 2.0 ** (-5.0 - jnp.arange(heads, dtype=jnp.float32))
    i = jnp.arange(tokens)[:, None]
    j = jnp.arange(tokens)[None, :]
    gap = jnp.where(i >= j, i - j, 0).astype(jnp.float32)
    weights = jnp.where(i >= j, decay_rate[:, None, None] ** gap, 0.0)            # (heads, t, t)
    scores = jnp.einsum("bhid,bhjd->bhij", queries, keys, preferred_element_type=jnp.float32) * weights
    scores = scores / jnp.clip(jnp.abs(scores).sum(-1, keepdims=True), 1.0, None)
    # Cast to the inputs' dtype, as JAXBench's program does: the judge's f32 truth then keeps the
    # scores unrounded. A file that casts to jnp.bfloat16 by name holds every kernel to that
    # rounding of the normalised scores, which a kernel that normalises at each row's end (the
    # retnet seed) cannot make: it misses the precision rule there (mean error 2.9e-4 against the
    # XLA program's 1.8e-4, issue 58).
    return jnp.einsum("bhij,bhjd->bhid", scores.astype(queries.dtype), values)
