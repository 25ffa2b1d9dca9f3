"""How a kernel's error compares with the task's XLA program's across secret draws: the max, the
99th percentile and the mean, as ratios (what the judge's precision bar reads, ``evaluator/correctness/compare.py``).

    .venv/bin/python scripts/precision_spread.py --draws 10 [--shape B=1,H=2,N=256,D=128] [--no-causal]

Kernels: the seed, seed + deferred_norm, seed + deferred_norm + approx_reciprocal, and the bf16
accumulation candidate (adversarial class 7), each run in interpret mode in this process on fresh
secret draws of every correctness distribution of the flash-attention task (trusted kernels only).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import secrets
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jcore

from evaluator.program import traced
from mutations import Edit, replay
from seeds import load_seed

ROOT = Path(__file__).resolve().parent.parent


def _interpreted(source: str, task, directory: Path, name: str):
    path = directory / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    specs = [jax.ShapeDtypeStruct(s, jnp.dtype(d)) for s, d in task.input_specs()]
    closed = traced.trace(functools.partial(getattr(module, task.entry), **task.kernel_kwargs()), specs)
    jaxpr = traced.with_interpret(closed.jaxpr, True)
    return jax.jit(lambda *xs: jcore.eval_jaxpr(jaxpr, closed.consts, *xs)[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=10, help="draws of every distribution (default 10)")
    parser.add_argument("--shape", default="B=1,H=2,N=256,D=128")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    seed = load_seed("flash_attention")
    task = seed.task(args.shape, causal=args.causal)
    kernels = {
        "seed": seed.kernel_source,
        "deferred_norm": replay(seed.kernel_source, [Edit("deferred_norm")], task).source,
        "deferred_norm+approx_reciprocal": replay(seed.kernel_source, [Edit("deferred_norm"),
                                                                      Edit("approx_reciprocal")], task).source,
        "bf16 accumulation (c7)": (ROOT / "tests/evaluator/adversarial/candidates/c7_bf16_accumulation.py").read_text(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        fns = {label: _interpreted(src, task, Path(tmp), f"k{i}") for i, (label, src) in enumerate(kernels.items())}
        reference = jax.jit(task.reference_program())
        ratios: dict[str, list[tuple[float, float, float]]] = {label: [] for label in fns}
        for _ in range(args.draws):
            for dist, _ in task.correctness_inputs:
                inputs = task.make_inputs(secrets.randbits(63), dist)
                truth = task.reference(*inputs)
                base = np.abs(np.asarray(reference(*inputs), np.float32) - truth)
                for label, fn in fns.items():
                    diff = np.abs(np.asarray(fn(*inputs), np.float32) - truth)
                    ratios[label].append((diff.max() / base.max(), np.quantile(diff, 0.99) / np.quantile(base, 0.99),
                                          diff.mean() / base.mean()))
    print(f"# {task.key}: error / the XLA program's error over {args.draws} draws x "
          f"{len(task.correctness_inputs)} distributions (min..max)")
    print("| kernel | max | 99th percentile | mean |")
    print("|---|---|---|---|")
    for label, rows in ratios.items():
        a = np.array(rows)
        print(f"| {label} | " + " | ".join(f"{a[:, i].min():.2f}..{a[:, i].max():.2f}" for i in range(3)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
