"""A batched projection, independent along its batch rows: the model-sized check's test task."""

import jax.numpy as jnp
import numpy as np

SIGNATURE = "x: bf16[B,S,D], w: bf16[D,N] -> f32[B,S,N]"
UNITS = "B"


def create_inputs(B=4, S=128, D=128, N=128):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, S, D), np.float32).astype(jnp.bfloat16)
    w = (rng.standard_normal((D, N), np.float32) / D**0.5).astype(jnp.bfloat16)
    return x, w


def workload(x, w):
    return jnp.einsum("bsd,dn->bsn", x, w, preferred_element_type=jnp.float32)
