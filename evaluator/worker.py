"""The child side of the judge: loads one kernel, lowers, compiles, runs it, and reports.

Run as ``python -m evaluator.worker REQUEST.json`` inside the sandbox (see ``sandbox.py``).
Nothing here judges: the worker only produces facts (compiler output, the kernel's outputs as
files, raw timing samples). Comparisons, references and verdicts are made by the parent, outside
the process that ran candidate code.

Request keys: ``mode`` ("candidate" or "reference"), ``kernel_path``, ``entry``, ``task`` (the
AttentionTask fields), ``chip`` (name), ``topology``, ``on_tpu`` (bool), ``inputs`` (list of
input-set directories), ``out_dir``, ``timing`` ({"warmup": n, "iters": n} or null).
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
import traceback

from evaluator.sandbox import Reporter

_VMEM_RE = re.compile(r'"used_scoped_memory_configs":\[(.*?)\]')
_SIZE_RE = re.compile(r'"size":"(\d+)"')
_COPY_RE = re.compile(r"\bcopy(-start)?\(")


def _error(reporter: Reporter, stage: str, exc: BaseException) -> None:
    message = f"{type(exc).__name__}: {exc}"
    reporter.send(event="error", stage=stage, kind=type(exc).__name__, message=message[:4000],
                  traceback="".join(traceback.format_exception(exc))[-4000:])


def _load_kernel(path: str, entry: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("candidate_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, entry, None)
    if not callable(fn):
        raise TypeError(f"the kernel module has no callable '{entry}'")
    return fn


def _hlo_facts(hlo_text: str) -> dict:
    vmem = 0
    for configs in _VMEM_RE.findall(hlo_text):
        vmem += sum(int(size) for size in _SIZE_RE.findall(configs))
    return {"vmem_bytes": vmem if _VMEM_RE.search(hlo_text) else None,
            "copy_trap": bool(_COPY_RE.search(hlo_text)),
            "custom_calls": hlo_text.count("tpu_custom_call")}


def _read_input(directory: str, name: str, dtype: str):
    import ml_dtypes
    import numpy as np

    raw = np.load(f"{directory}/{name}.npy", allow_pickle=False)
    return raw.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else raw


def _write_output(path: str, out) -> dict:
    import numpy as np

    array = np.asarray(out)
    dtype = str(array.dtype)
    stored = array.view(np.uint16) if dtype == "bfloat16" else array
    np.save(path, np.ascontiguousarray(stored), allow_pickle=False)
    return {"dtype": dtype, "shape": list(array.shape)}


def main(request_path: str) -> int:
    reporter = Reporter()
    with open(request_path) as fh:
        req = json.load(fh)
    task = req["task"]
    shape = (task["batch"], task["heads"], task["seq_len"], task["head_dim"])

    stage = "load"
    try:
        reporter.stage(stage)
        import jax
        import jax.numpy as jnp
        from jax.experimental.pallas import tpu as pltpu
        from jax.sharding import SingleDeviceSharding

        if req["mode"] == "reference":
            from seeds.flash_attention.task import AttentionTask, reference_program

            fn = reference_program(AttentionTask(**task))
        else:
            kernel = _load_kernel(req["kernel_path"], req["entry"])
            fn = functools.partial(kernel, causal=task["causal"],
                                   sm_scale=1.0 / float(task["head_dim"]) ** 0.5)

        stage = "lower"
        reporter.stage(stage)
        if req["on_tpu"]:
            device = jax.devices()[0]
        else:
            from jax.experimental import topologies

            device = topologies.get_topology_desc(
                topology_name=req["topology"], platform="tpu").devices[0]
        spec = jax.ShapeDtypeStruct(shape, jnp.dtype(task["dtype"]),
                                    sharding=SingleDeviceSharding(device))
        t0 = time.perf_counter()
        lowered = jax.jit(fn).lower(spec, spec, spec)
        reporter.send(event="stage_ok", stage=stage, data={"lower_time_s": time.perf_counter() - t0})

        stage = "compile"
        reporter.stage(stage)
        t0 = time.perf_counter()
        compiled = lowered.compile()
        facts = _hlo_facts(compiled.as_text())
        facts["compile_time_s"] = time.perf_counter() - t0
        reporter.send(event="stage_ok", stage=stage, data=facts)

        stage = "correctness"
        reporter.stage(stage)
        outputs = []
        for i, directory in enumerate(req["inputs"]):
            args = [_read_input(directory, name, task["dtype"]) for name in ("q", "k", "v")]
            if req["on_tpu"]:
                out = compiled(*[jax.device_put(a, device) for a in args])
            else:
                cpu_args = [jnp.asarray(a) for a in args]
                with pltpu.force_tpu_interpret_mode():
                    out = jax.jit(fn)(*cpu_args)
            jax.block_until_ready(out)
            outputs.append(_write_output(f"{req['out_dir']}/out{i}.npy", out))
        reporter.send(event="stage_ok", stage=stage, data={"outputs": outputs})

        if req["on_tpu"] and req.get("timing"):
            stage = "timing"
            reporter.stage(stage)
            args = [jax.device_put(_read_input(req["inputs"][0], n, task["dtype"]), device)
                    for n in ("q", "k", "v")]
            for _ in range(req["timing"]["warmup"]):
                jax.block_until_ready(compiled(*args))
            samples = []
            for _ in range(req["timing"]["iters"]):
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(*args))
                samples.append(time.perf_counter() - t0)
            reporter.send(event="stage_ok", stage=stage, data={"samples_s": samples})
    except BaseException as exc:  # noqa: BLE001 - everything is reported, nothing escapes
        _error(reporter, stage, exc)
        return 1
    reporter.send(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
