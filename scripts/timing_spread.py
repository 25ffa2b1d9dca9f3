"""How much a figure moves between judges, now that the timing input is a secret draw.

    .venv/bin/python scripts/timing_spread.py [--judges 5] [--shape B=8,H=8,HKV=8,N=4096,D=128,T=1]

Each judge draws its own timing input (the decode task's cache lengths, ``ragged``), so a kernel
whose work follows the lengths gets another figure from another judge. Judged by ``--judges``
fresh judges: the naive decode kernel (its work does not depend on the lengths: the same figure
every time), the kernel with the K/V DMAs past each length skipped, and with the compute skipped
there too (a branch on data, counted on the timing input). Prints each judge's lengths' total and
every kernel's figure, then each kernel's spread (max / min).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evaluator.judge import Judge, JudgeConfig  # noqa: E402
from mutations import Edit, replay  # noqa: E402
from seeds import load_seed  # noqa: E402
from tests.judging import judge_all  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--judges", type=int, default=5)
    p.add_argument("--shape", default="B=8,H=8,HKV=8,N=4096,D=128,T=1")
    p.add_argument("--chip", default="v5e")
    a = p.parse_args()
    seed = load_seed("flash_decoding")
    task = seed.task(a.shape)
    naive = seed.kernel_source
    dma = replay(naive, [Edit("length_skip", {"compute": False})], task).source
    both = replay(naive, [Edit("length_skip", {"compute": False}), Edit("length_skip", {"compute": True})], task).source
    kernels = {"naive": naive, "length_skip (DMA)": dma, "length_skip (DMA + compute)": both}
    figures: dict[str, list[int | None]] = {name: [] for name in kernels}
    print(f"task {task.key}, {a.chip}; {a.judges} judges, each with its own secret timing input\n")
    print("| judge | sum of lengths | " + " | ".join(kernels) + " |")
    print("|---|---|" + "---|" * len(kernels))
    for i in range(a.judges):
        judge = Judge(JudgeConfig(chip=a.chip, workers=2))
        lengths = judge.references.timing_arrays(task)["lengths"]
        results = judge_all(judge, list(kernels.values()), task)
        row = []
        for name, r in zip(kernels, results, strict=True):
            figures[name].append(r.metrics.estimated_cycles if r.status.value == "PASS" else None)
            row.append(f"{r.metrics.estimated_cycles:,}" if r.status.value == "PASS" else r.status.value)
        print(f"| {i + 1} | {int(lengths.sum()):,} | " + " | ".join(row) + " |")
    print(f"\nsource: {results[0].provenance.timing_source}, libtpu {results[0].provenance.libtpu_version}")
    for name, values in figures.items():
        ok = [v for v in values if v]
        if ok:
            print(f"{name}: {min(ok):,} .. {max(ok):,} cycles, spread {max(ok) / min(ok):.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
