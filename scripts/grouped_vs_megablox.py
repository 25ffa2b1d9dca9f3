"""The grouped matmul beside its peers, under one timing source: XLA's ``ragged_dot``, JAX's
``megablox.gmm`` at its default tiling and across a grid of tilings, and our kernels.

    .venv/bin/python scripts/grouped_vs_megablox.py [--shape M=512,K=1024,N=2048,E=8] [--chip v5e] \
        [--memory GIB] [--tiling TM,TK,TN ...] [KERNEL.py ...]

Every figure is the judge's (``Judge.estimate_timing``, counted on its secret timing input: the
loops, branches and data-dependent index maps of our kernels, and megablox's grid, whose size is
data, ``evaluator/figure/dynamic_grid.py``), under ``compiler_estimate_no_vmem_msa``: every program
compiled with XLA's VMEM memory-space assignment off, since libtpu 0.0.42.1's profiler aborts on
the VMEM-to-SMEM copies both ``ragged_dot`` and megablox's group metadata hold otherwise
(docs/judge.md). Those figures are never compared with ``compiler_estimate``'s. megablox is read
from the installed package; nothing here checks correctness (``evolve eval --timing
compiler_estimate_no_vmem_msa`` does, for any of these).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

TIMING = "compiler_estimate_no_vmem_msa"
DEFAULT_TILING = (128, 128, 128)     # megablox.gmm's own default


TEMPLATE = '''
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox import gmm as _gmm


def gmm(lhs, rhs, group_sizes):
    return _gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=({tm}, {tk}, {tn}))
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", nargs="*", type=Path)
    parser.add_argument("--shape", default="M=512,K=1024,N=2048,E=8")
    parser.add_argument("--chip", default="v5e")
    parser.add_argument("--memory", type=int, default=0, help="each judged child's address space, GiB (0: 12)")
    parser.add_argument("--tiling", action="append", default=None,
                        help="a megablox tiling TM,TK,TN (repeatable); default: its own and a grid")
    args = parser.parse_args()

    from evaluator.judge import Judge
    from evolve.config import JudgeSettings
    from evaluator.versions import versions
    from seeds import load_seed

    seed = load_seed("grouped_matmul")
    task = seed.task(args.shape)
    judge = Judge(JudgeSettings(chip=args.chip, timing=TIMING, workers=1, memory_gib=args.memory).judge_config())
    chip, v = judge.chip, versions()
    lhs, rhs = task.input_specs()[0][0], task.input_specs()[1][0]
    shape = (lhs[0], lhs[1], rhs[2], rhs[0])
    floor = math.ceil(task.bytes_moved / chip.hbm_bytes_per_s * chip.clock_hz)
    print(f"# {task.key} on {args.chip}; timing source {judge.source_label(task)}, libtpu "
          f"{v['libtpu_version']}, jax {v['jax_version']}; estimates only, no correctness check; "
          f"HBM floor of the task's unavoidable bytes {floor:,} cycles")
    reference, _ = judge.estimate_timing(None, task)
    rows = [("XLA `ragged_dot` (the task's own program)", reference.cycles, reference.error or reference.note)]
    tilings = [tuple(int(x) for x in t.split(",")) for t in args.tiling] if args.tiling else _grid(shape)
    entries = [("our seed", seed.kernel_source)] + [(str(p), p.read_text()) for p in args.kernels] + [
        (f"megablox.gmm tiling {t}" + (" (its default)" if t == DEFAULT_TILING else ""),
         TEMPLATE.format(tm=t[0], tk=t[1], tn=t[2])) for t in tilings]
    for label, source in entries:
        timing, _ = judge.estimate_timing(source, task, count=True)
        rows.append((label, timing.cycles, timing.error or timing.note))
    xla = reference.cycles
    print("| program | cycles | latency (us) | vs XLA | note |")
    print("|---|---|---|---|---|")
    for label, cycles, note in rows:
        if cycles is None:
            print(f"| {label} | no figure | | | {note[:160]} |")
            continue
        ratio = f"{xla / cycles:.3f}x" if xla else "-"
        print(f"| {label} | {cycles:,} | {cycles / chip.clock_hz * 1e6:.1f} | {ratio} | {note[:160]} |")
    return 0


def _grid(shape) -> list[tuple[int, int, int]]:
    """megablox's default, then tilings a user would sweep: row tiles of 128 to 512, and K and N
    tiles that divide the problem, up to what fits the default scoped VMEM."""
    m, k, n, _ = shape
    out = [DEFAULT_TILING]
    for tm in (128, 256, 512):
        for tk in (512, 1024, 2048):
            for tn in (512, 1024, 2048):
                fits = 2 * (tm * tk + tk * tn) * 2 + 3 * tm * tn * 4 <= 16 << 20
                if m % tm == 0 and k % tk == 0 and n % tn == 0 and fits and (tm, tk, tn) not in out:
                    out.append((tm, tk, tn))
    return out


if __name__ == "__main__":
    sys.exit(main())
