"""CLASS 8: outputs keyed to known inputs, selected inside a Pallas kernel and padded above the roofline.

The correctness inputs used to be fixed and public (the task's seeds). This kernel regenerates the
task's documented input sets at trace time with numpy, computes the exact f32 attention of each,
and passes the three results to a trivial kernel as operands. The kernel picks one by comparing
the first row of q with each set's, and runs unused matmuls so that its estimate sits above the
roofline (it is not SUSPECT). It computes no attention.

Expected: refused (FAIL_TRACE) for the constants it carries (three outputs); with the constant
budget lifted, FAIL_CORRECTNESS (the judge's inputs are secret draws, none of the known sets);
with both defences off (public sets, no budget) it PASSes: the hole this class is about.
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
    keys = np.stack([np.asarray(s[0][0, 0, 0, :], np.float32) for s in sets])            # (sets, D)
    outs = [reference_f32(task, *s).astype(s[0].dtype) for s in sets]
    return keys, outs


def _select_kernel(q_ref, keys_ref, *refs):
    *outs_ref, out_ref = refs
    row = q_ref[0, 0, :1, :].astype(jnp.float32)                                          # (1, D)
    dist = [jnp.sum(jnp.abs(row - keys_ref[i:i + 1, :]), axis=1, keepdims=True) for i in range(len(outs_ref))]
    chosen, best = outs_ref[0][0, 0].astype(jnp.float32), dist[0]
    for o_ref, d in zip(outs_ref[1:], dist[1:]):        # the set whose first row is nearest
        take = d < best
        chosen, best = jnp.where(take, o_ref[0, 0].astype(jnp.float32), chosen), jnp.where(take, d, best)
    x = q_ref[0, 0].astype(jnp.float32)

    def pad(_, acc):
        return jnp.dot(acc, x, preferred_element_type=jnp.float32) * 1e-30

    waste = jax.lax.fori_loop(0, PAD_MATMULS, pad, x)
    out_ref[0, 0] = (chosen + 0.0 * waste[:, :1]).astype(out_ref.dtype)


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    del k, v, sm_scale
    b, h, n, d = q.shape
    keys, outs = _known_sets(q.shape, q.dtype, causal)
    block = min(128, n)
    out_spec = pl.BlockSpec((1, 1, block, d), lambda bi, hi, i: (bi, hi, i, 0))
    return pl.pallas_call(
        _select_kernel,
        grid=(b, h, n // block),
        in_specs=[pl.BlockSpec((1, 1, block, d), lambda bi, hi, i: (0, 0, 0, 0)),
                  pl.BlockSpec((8, d), lambda bi, hi, i: (0, 0)),
                  *[out_spec] * len(outs)],
        out_specs=out_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(q, jnp.asarray(np.pad(keys, ((0, 8 - len(keys)), (0, 0)))), *(jnp.asarray(o) for o in outs))
