"""The jailed side of the judge: loads one candidate, traces it once, ships the jaxpr as data.

Run as ``python -m evaluator.containment.worker REQUEST.json`` inside the jail (``jail.py``, ``sandbox.py``),
as an unprivileged user whose only writable place is its scratch directory. This is the only
process that ever runs candidate code, and it produces nothing but one artifact: the traced
jaxpr, as data (``wire.py``). It never lowers or exports a program, never sees the inputs,
never compiles for the TPU, never writes an output or a profile. Everything after the trace
happens in the trusted runner (``runner.py``), which never imports candidate code.

Request keys: ``kernel_path``, ``entry``, ``specs`` ([shape, dtype] of each input), ``kwargs``
(the entry point's static keyword arguments), ``out_dir``, off a TPU host ``device_kind`` (the
judged chip's, see :func:`_judged_chip`), and for a task with a mesh ``mesh``
({"axis": name, "specs": {chips: per-chip specs}}): a kernel whose module sets ``CHIPS`` to one of
those counts is traced as the per-chip program, at the per-chip specs, with the axis bound. The
worker says which count it traced for; the runner trusts nothing of it but checks the jaxpr's
inputs against the task's per-chip specs for that count. The worker knows no seed.
"""

from __future__ import annotations

import functools
import json
import sys
import time

from evaluator.containment.sandbox import Reporter

PROGRAM_FILE = "program.jaxpr"


def _load_kernel(path: str, entry: str):
    """The candidate's module and its entry point."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("candidate_kernel", path)
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an import would: a dataclass under `from __future__ import
    # annotations` (JAX's own flash attention's BlockSizes) looks its module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, entry, None)
    if not callable(fn):
        raise TypeError(f"the kernel module has no callable '{entry}'")
    return module, fn


class _JudgedDevice:
    """A device of this process, but saying it is the judged chip (``device_kind``)."""

    def __init__(self, device, kind: str) -> None:
        self._device, self.device_kind = device, kind

    def __getattr__(self, name: str):
        return getattr(self._device, name)

    def __repr__(self) -> str:
        return f"{self.device_kind} (judged; traced on {self._device!r})"


def _judged_chip(jax, kind: str | None) -> None:
    """Off a TPU host, a kernel that asks which chip it runs on is told the chip it is judged on.
    Production kernels ask at trace time: JAX's ragged paged attention looks its tuned block
    sizes up by ``jax.devices()[0].device_kind``, megablox checks for a TPU. Traced once, the
    program is both checked and timed, so both see the same answer. Only the public
    ``jax.devices`` is answered; JAX's own internals keep the real CPU devices, except Pallas'
    table of the chip's sizes, which ``pltpu.emit_pipeline`` reads at trace time for its tiling."""
    if not kind:
        return
    from evaluator.chips import answer_cpu_as

    answer_cpu_as(kind)
    real = jax.devices

    def devices(backend=None):
        return [_JudgedDevice(d, kind) for d in real(backend)]

    jax.devices = devices


def _chips(module, mesh: dict | None) -> int:
    """How many chips the kernel says it uses (module-level CHIPS, default 1), if the task has them."""
    chips = getattr(module, "CHIPS", 1)
    offered = sorted(int(c) for c in (mesh or {}).get("specs", {}))
    if chips == 1:
        return 1
    if isinstance(chips, bool) or not isinstance(chips, int) or chips not in offered:
        raise ValueError(f"the kernel sets CHIPS={chips!r}, but the task offers "
                         f"{' or '.join(map(str, [1, *offered]))} chip(s); run with --chips {chips} "
                         "or use a 1-chip kernel")
    return chips


def main(request_path: str) -> int:
    reporter = Reporter()
    with open(request_path) as fh:
        req = json.load(fh)

    stage = "load"
    try:
        reporter.stage(stage)
        import jax
        import jax.numpy as jnp

        from evaluator.program import traced, wire

        _judged_chip(jax, req.get("device_kind"))
        module, kernel = _load_kernel(req["kernel_path"], req["entry"])
        fn = functools.partial(kernel, **req["kwargs"])
        mesh = req.get("mesh")
        chips = _chips(module, mesh)

        stage = "lower"
        reporter.stage(stage)
        t0 = time.perf_counter()
        shapes = req["specs"] if chips == 1 else mesh["specs"][str(chips)]
        specs = tuple(jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype)) for shape, dtype in shapes)
        closed = traced.trace(fn, specs, axis_env=[(mesh["axis"], chips)] if chips > 1 else None)
        with open(f"{req['out_dir']}/{PROGRAM_FILE}", "wb") as fh:
            fh.write(wire.dumps(closed))
        reporter.send(event="stage_ok", stage=stage,
                      data={"trace_time_s": time.perf_counter() - t0, "chips": chips})
    except BaseException as exc:  # noqa: BLE001 - everything is reported, nothing escapes
        reporter.error(stage, exc)
        return 1
    reporter.send(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
