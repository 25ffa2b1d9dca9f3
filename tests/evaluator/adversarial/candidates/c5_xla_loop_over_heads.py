"""CLASS 5: an XLA fori_loop over heads around a one-head kernel: the estimate counts the loop body once.

Expected: the runner unrolls a loop of a constant trip count (evaluator/program/static_loops.py), so
every head's kernel is counted: correct, and scored within 10% of the same calls written out by hand
(HONEST = True), never as one head's work.
"""

import jax
import jax.numpy as jnp

# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact

HONEST = False


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    def one_head(h, out):
        qh, kh, vh = (jax.lax.dynamic_slice_in_dim(x, h, 1, axis=1) for x in (q, k, v))
        return jax.lax.dynamic_update_slice_in_dim(
            out, _exact(qh, kh, vh, causal=causal, sm_scale=sm_scale), h, axis=1)
    if HONEST:      # the same calls, written out
        out = jnp.zeros_like(q)
        for h in range(q.shape[1]):
            out = one_head(h, out)
        return out
    return jax.lax.fori_loop(0, q.shape[1], one_head, jnp.zeros_like(q))
