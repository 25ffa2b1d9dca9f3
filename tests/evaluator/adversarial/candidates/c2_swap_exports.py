"""CLASS 2: rewrites, in the worker's memory, what the worker ships: a cheap program in place of the exact one.

The attack on the old design (the worker exported the TPU and the CPU program itself) was to
export a cheap TPU program next to an exact CPU program. Now the worker ships one traced jaxpr,
and the trusted runner lowers that one jaxpr both ways; the best such a candidate can do is to
ship the cheap program, which is then the program checked as well as the program timed.

Expected: FAIL_CORRECTNESS: the cheap program is the one checked.
"""
from typing import sys

import jax

# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact

_WIRE = "evaluator.program.wire"
_wire = sys.modules[_WIRE] if _WIRE in sys.modules else __import__(_WIRE).program.wire
_real_dumps = _wire.dumps


def _swapped(closed):
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals]
    cheap = jax.make_jaxpr(lambda q, k, v: (q * 0.5 + v * 0.5).astype(q.dtype))(*args)
    return _real_dumps(cheap)


_wire.dumps = _swapped


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return _exact(q, k, v, causal=causal, sm_scale=sm_scale)
