"""CLASS 5: an XLA fori_loop over heads around a one-head kernel: the estimate counts the loop body once.

Expected: correct, then FAIL_TIMING naming xla_loop.
"""

import jax
import jax.numpy as jnp

# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    def one_head(h, out):
        qh, kh, vh = (jax.lax.dynamic_slice_in_dim(x, h, 1, axis=1) for x in (q, k, v))
        return jax.lax.dynamic_update_slice_in_dim(
            out, _exact(qh, kh, vh, causal=causal, sm_scale=sm_scale), h, axis=1)
    return jax.lax.fori_loop(0, q.shape[1], one_head, jnp.zeros_like(q))
