"""CLASS 8: outputs keyed to known inputs, selected in XLA around a copy kernel padded above the roofline.

Like c8_known_outputs_in_kernel, but the choice among the three known outputs (by the first row
of q) is made by XLA outside the kernel; the kernel only copies the chosen output and wastes time.

Expected: refused (FAIL_TRACE) for the constants it carries; with the budget lifted,
FAIL_CORRECTNESS (secret inputs); with both defences off, whatever the estimate makes of it.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from seeds.flash_attention.task import Task, make_inputs, reference_f32

PAD_MATMULS = 2     # unused 128x128x128 matmuls per block: the estimate above the roofline


def _known_sets(shape, dtype, causal):
    b, h, n, d = shape
    task = Task(batch=b, heads=h, seq_len=n, head_dim=d, causal=causal, dtype=str(np.dtype(dtype)))
    sets = [make_inputs(task, seed, dist) for dist, seed in Task.correctness_inputs]
    keys = np.stack([np.asarray(s[0][0, 0, 0, :], np.float32) for s in sets])
    outs = np.stack([reference_f32(task, *s).astype(s[0].dtype) for s in sets])
    return keys, outs


def _copy_kernel(x_ref, out_ref):
    x = x_ref[0, 0].astype(jnp.float32)

    def pad(_, acc):
        return jnp.dot(acc, x, preferred_element_type=jnp.float32) * 1e-30

    waste = jax.lax.fori_loop(0, PAD_MATMULS, pad, x)
    out_ref[0, 0] = (x + 0.0 * waste[:, :1]).astype(out_ref.dtype)


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    del k, v, sm_scale
    b, h, n, d = q.shape
    keys, outs = _known_sets(q.shape, q.dtype, causal)
    row = q[0, 0, 0, :].astype(jnp.float32)
    chosen = jnp.take(jnp.asarray(outs), jnp.argmin(jnp.sum(jnp.abs(row[None] - keys), axis=1)), axis=0)
    block = min(128, n)
    spec = pl.BlockSpec((1, 1, block, d), lambda bi, hi, i: (bi, hi, i, 0))
    return pl.pallas_call(_copy_kernel, grid=(b, h, n // block), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype))(chosen)
