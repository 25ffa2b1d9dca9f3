"""Mamba-2-2.7B's state-space duality in its quadratic (attention-like) form, as a user writes it
in plain JAX, with no kernel: the decay between positions is the product of sigmoid(A_log) over
the positions between them, applied to the causal scores C·B, each row divided by its sum's
magnitude (at least one; a sum under 1e-6 counts as one), then applied to x.

`evolve run --reference examples/jaxbench/mamba2_ssd.py --chip v6e` serves it with a seed
(docs/own-kernel.md); its defaults are the model's shape (batch 4, 4096 tokens, 64 heads, 64-wide
states and head)."""

import jax
import jax.numpy as jnp
import numpy as np


def create_inputs(batch=4, tokens=4096, heads=64, state=64, head=64):
    gen = np.random.default_rng(7)

    def normal(*shape):
        return gen.standard_normal(shape, np.float32).astype(jnp.bfloat16)

    a_log = (gen.standard_normal((batch, heads, tokens), np.float32) * 0.5 - 4.0).astype(np.float32)
    return a_log, normal(batch, heads, tokens, head), normal(batch, heads, tokens, state), \
        normal(batch, heads, tokens, state)


def workload(A_log, x, B, C):
    log_decay = jnp.cumsum(jnp.log(jax.nn.sigmoid(A_log) + 1e-8), axis=-1)          # (b, h, t)
    tokens = x.shape[2]
    later = jnp.arange(tokens)[:, None] >= jnp.arange(tokens)[None, :]
    between = log_decay[..., :, None] - log_decay[..., None, :]
    L = jnp.exp(jnp.where(later, between, -jnp.inf))
    scores = jnp.einsum("bhin,bhjn->bhij", C.astype(jnp.float32), B.astype(jnp.float32)) * L
    row = scores.sum(-1, keepdims=True)
    row = jnp.where(jnp.abs(row) < 1e-6, 1.0, row)
    scores = scores / jnp.maximum(jnp.abs(row), 1.0)
    return jnp.einsum("bhij,bhjp->bhip", scores.astype(x.dtype), x)
