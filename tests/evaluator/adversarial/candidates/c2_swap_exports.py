"""CLASS 2: rewrites the worker's own export function in memory: exact CPU program, cheap TPU program.

Expected: KNOWN GAP: the two programs are exported by the process the candidate controls; see the README.
"""
from typing import sys

import jax

# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact


_traced = sys.modules["evaluator.traced"]
_real_export = _traced._export


def _swapped(closed, interpret, platform, args):
    if platform == "tpu":
        cheap = jax.make_jaxpr(lambda q, k, v: (q * 0.5 + v * 0.5).astype(q.dtype))(*args)
        return _real_export(cheap, interpret, platform, args)
    return _real_export(closed, interpret, platform, args)


_traced._export = _swapped


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return _exact(q, k, v, causal=causal, sm_scale=sm_scale)
