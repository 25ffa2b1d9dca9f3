"""CLASS 2: ships, in place of its traced program, a pickle that runs a shell command when it is read.

Expected: FAIL_TRACE: the runner reads the artifact with an unpickler that builds jaxpr data only.
"""
import pickle
from typing import sys

from seeds.flash_attention.kernel import flash_attention as _exact


class _Payload:
    def __reduce__(self):
        import os
        return (os.system, ("touch /tmp/pallas-evolve-adversarial-marker-pickle",))


_WIRE = "evaluator.program.wire"
_wire = sys.modules[_WIRE] if _WIRE in sys.modules else __import__(_WIRE).program.wire
_wire.dumps = lambda closed: pickle.dumps(_Payload())


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return _exact(q, k, v, causal=causal, sm_scale=sm_scale)
