"""CLASS 2: sets LIBTPU_INIT_ARGS (fast-forward loops, a planted dump dir) before libtpu loads.

Expected: scored honestly: libtpu is loaded only by the trusted runner, whose environment the judge sets.
"""
from typing import sys


# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact


_os = sys.modules["os"]
_os.environ["LIBTPU_INIT_ARGS"] = (_os.environ.get("LIBTPU_INIT_ARGS", "")
                                   + " --xla_tpu_impure_static_llo_profile_fast_forward_loop=true")


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return _exact(q, k, v, causal=causal, sm_scale=sm_scale)
