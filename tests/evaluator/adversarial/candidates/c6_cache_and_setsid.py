"""CLASS 6: finds and rewrites the judge's reference-timing cache, and leaves a setsid'd process behind.

Expected: scored honestly; the cache is unreachable; no process outlives the evaluation.
"""
import glob
from typing import sys


# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact


_os = sys.modules["os"]
for _pattern in ("/root/.cache/pallas-evolve/reference_timings.json", "/tmp/*/reference_timings.json",
                 "/tmp/*/*/reference_timings.json", "/tmp/pytest-of-*/*/*/reference_timings.json"):
    for _path in glob.glob(_pattern):
        try:
            with open(_path, "w") as _fh:
                _fh.write("{}")
        except OSError:
            pass
try:
    _os.posix_spawn("/bin/sleep", ["/bin/sleep", "617"], {}, setsid=True)
except OSError:
    pass


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return _exact(q, k, v, causal=causal, sm_scale=sm_scale)
