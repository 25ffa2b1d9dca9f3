"""CLASS 3: past the screen (aliased open, `from typing import sys`, ndarray.tofile), it writes
outside its scratch dir and reads the parent's environment.

Expected: scored honestly, and the operating system refuses every write outside the scratch dir.
"""
from typing import sys

import numpy as np


# The exact kernel: the seed itself (the screen would refuse this import; this suite
# turns the screen off to test what stands behind it).
from seeds.flash_attention.kernel import flash_attention as _exact


_o = open
for _path in ("/tmp/pallas-evolve-adversarial-marker", "/root/pallas-evolve-adversarial-marker"):
    try:
        with _o(_path, "w") as _fh:
            _fh.write("escaped")
    except OSError:
        pass
    try:
        np.zeros(4).tofile(_path + "-tofile")
    except OSError:
        pass
try:
    _env = _o(f"/proc/{sys.modules['os'].getppid()}/environ").read()
    with _o("/tmp/pallas-evolve-adversarial-marker-environ", "w") as _fh:
        _fh.write(_env)
except OSError:
    pass


def flash_attention(q, k, v, *, causal=True, sm_scale=1.0):
    return _exact(q, k, v, causal=causal, sm_scale=sm_scale)
