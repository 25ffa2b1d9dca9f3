"""CLASS 4: the attention is computed on the host in numpy through jax.pure_callback.

Expected: refused (FAIL_TRACE): a host callback is work no TPU estimate sees.
"""
import numpy as np
import functools

import jax

# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).


def _host(q, k, v, sm_scale):
    q32, k32, v32 = (np.asarray(x, np.float32) for x in (q, k, v))
    s = np.einsum("bhqd,bhkd->bhqk", q32, k32) * sm_scale
    n = s.shape[-1]
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v32)).astype(q.dtype)


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return jax.pure_callback(functools.partial(_host, sm_scale=sm_scale),
                             jax.ShapeDtypeStruct(q.shape, q.dtype), q, k, v)
