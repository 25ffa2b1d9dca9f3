"""CLASS 10 (inputs past the example's range): a row-wise softmax without its row max subtracted.

exp(x) / sum(exp(x)) is the softmax wherever exp(x) is finite, and one subtraction cheaper than the
stable exp(x - max) / sum(exp(x - max)). Judged against ``../softmax_reference.py`` (logits drawn
from N(0, 1)), every draw near the example's spread (``normal``; ``outliers``, twenty spreads out;
``scaled``, the whole draw times at most 10) keeps every logit below 88.7, where f32 exp is still
finite, and the two agree to an ulp. Past it exp is inf, and a row holding such a logit is inf / inf
= NaN: real logits get there, no draw near the example did.

Expected: FAIL_CORRECTNESS on the ``wide`` set (the first draw with its logits 100 to 1000 times the
example's), "NaN/Inf value(s) in the output where the reference's is finite on input set 4 (wide,
...)". Before the wide set it PASSed, at a figure no higher than its twin's. Honest twin
(``HONEST = True``): the row max subtracted before exp.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

HONEST = False
BLOCK_ROWS = 8


def _kernel(x_ref, o_ref):
    x = x_ref[...]
    if HONEST:
        x = x - jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x)
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


@jax.jit
def softmax(x):
    rows, cols = x.shape
    block = min(BLOCK_ROWS, rows)
    return pl.pallas_call(
        _kernel,
        grid=(rows // block,),
        in_specs=[pl.BlockSpec((block, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
