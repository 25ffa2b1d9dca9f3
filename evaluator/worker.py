"""The jailed side of the judge: loads one candidate, traces it once, ships the jaxpr as data.

Run as ``python -m evaluator.worker REQUEST.json`` inside the jail (``jail.py``, ``sandbox.py``),
as an unprivileged user whose only writable place is its scratch directory. This is the only
process that ever runs candidate code, and it produces nothing but one artifact: the traced
jaxpr, as data (``wire.py``). It never lowers or exports a program, never sees the inputs,
never compiles for the TPU, never writes an output or a profile. Everything after the trace
happens in the trusted runner (``runner.py``), which never imports candidate code.

Request keys: ``kernel_path``, ``entry``, ``specs`` ([shape, dtype] of each input), ``kwargs``
(the entry point's static keyword arguments), ``out_dir``. The worker knows no seed.
"""

from __future__ import annotations

import functools
import json
import sys
import time

from evaluator.sandbox import Reporter

PROGRAM_FILE = "program.jaxpr"


def _load_kernel(path: str, entry: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("candidate_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, entry, None)
    if not callable(fn):
        raise TypeError(f"the kernel module has no callable '{entry}'")
    return fn


def main(request_path: str) -> int:
    reporter = Reporter()
    with open(request_path) as fh:
        req = json.load(fh)

    stage = "load"
    try:
        reporter.stage(stage)
        import jax
        import jax.numpy as jnp

        from evaluator import traced, wire

        kernel = _load_kernel(req["kernel_path"], req["entry"])
        fn = functools.partial(kernel, **req["kwargs"])

        stage = "lower"
        reporter.stage(stage)
        t0 = time.perf_counter()
        specs = tuple(jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype)) for shape, dtype in req["specs"])
        closed = traced.trace(fn, specs)
        with open(f"{req['out_dir']}/{PROGRAM_FILE}", "wb") as fh:
            fh.write(wire.dumps(closed))
        reporter.send(event="stage_ok", stage=stage,
                      data={"trace_time_s": time.perf_counter() - t0})
    except BaseException as exc:  # noqa: BLE001 - everything is reported, nothing escapes
        reporter.error(stage, exc)
        return 1
    reporter.send(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
