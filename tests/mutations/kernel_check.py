"""Shared helpers for the mutation tests: load a kernel source, run it in interpret mode."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO = Path(__file__).resolve().parents[2]
SEED_PATH = REPO / "seeds" / "flash_attention" / "kernel.py"
_counter = itertools.count()


def seed_source() -> str:
    return SEED_PATH.read_text()


def load_kernel(source: str, directory: str | None = None):
    """Import a kernel module from source text (written to a temporary file)."""
    directory = directory or tempfile.mkdtemp(prefix="mutated_kernel_")
    name = f"_mutated_kernel_{os.getpid()}_{next(_counter)}"
    path = Path(directory) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def check_correct(source: str, task, seeds=(("normal", 0), ("outliers", 2))) -> str | None:
    """None when the kernel matches reference_f32 under TOLERANCES, else a description."""
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu

    from seeds.flash_attention.task import make_inputs, reference_f32

    module = load_kernel(source)
    atol, rtol = task.tolerance
    for distribution, seed in seeds:
        q, k, v = make_inputs(task, seed, distribution)
        with pltpu.force_tpu_interpret_mode():
            out = module.flash_attention(q, k, v, causal=task.causal, sm_scale=task.sm_scale)
            out = np.asarray(out.astype("float32"))
        ref = reference_f32(task, q, k, v)
        if out.shape != ref.shape:
            return f"shape {out.shape} != {ref.shape}"
        if np.isnan(out).any():
            return f"NaN in output ({distribution}, seed {seed})"
        err = np.abs(out - ref)
        bad = err > atol + rtol * np.abs(ref)
        if bad.any():
            return (f"{int(bad.sum())} elements out of tolerance ({distribution}, seed {seed}); "
                    f"max abs error {float(err.max()):.3g}")
    return None
