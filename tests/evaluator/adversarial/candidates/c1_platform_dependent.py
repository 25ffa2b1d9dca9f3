"""CLASS 1: a cheap program on TPU, exact attention everywhere else (lax.platform_dependent).

Expected: refused (FAIL_TRACE): one traced program cannot branch on the platform.
"""

import jax

# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return jax.lax.platform_dependent(
        q, k, v,
        tpu=lambda q, k, v: (q * 0.5 + v * 0.5).astype(q.dtype),
        default=lambda q, k, v: _exact(q, k, v, causal=causal, sm_scale=sm_scale))
