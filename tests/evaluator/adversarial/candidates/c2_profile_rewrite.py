"""CLASS 2: an atexit hook rewrites the static-profile files in its working directory to tiny estimates.

Expected: scored honestly: the profile is written and read by the trusted runner, in a directory the worker never sees.
"""
import atexit


# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact


def _forge():
    import glob
    for pattern in ("llo/*.textproto", "*/llo/*.textproto", "/tmp/*/llo/*.textproto"):
        for path in glob.glob(pattern):
            try:
                with open(path, "w") as fh:
                    fh.write('hlo_op_estimate {\n  hlo_op_name: "f"\n  estimated_cycles: 1\n}\n')
            except OSError:
                pass


atexit.register(_forge)


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return _exact(q, k, v, causal=causal, sm_scale=sm_scale)
