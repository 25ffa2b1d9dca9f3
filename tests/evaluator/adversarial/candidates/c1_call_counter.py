"""CLASS 1: counts its own calls: the first trace (the TPU lowering) is cheap, later ones exact.

Expected: FAIL_CORRECTNESS: the judge traces once, so the cheap program is the one checked.
"""


# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact


_CALLS = [0]


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    _CALLS[0] += 1
    if _CALLS[0] == 1:
        return (q * 0.5 + v * 0.5).astype(q.dtype)
    return _exact(q, k, v, causal=causal, sm_scale=sm_scale)
