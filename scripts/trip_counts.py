"""The trip-count experiment: a loop bounded by scalar prefetch against the same loop with a
compile-time bound, at 1, 2, 4 and 8 real trips, judged in full.

    .venv/bin/python scripts/trip_counts.py [--shape B=1,H=2,N=1024,D=128] [--chip v5e]

The kernel is the adversarial candidate ``c5_prefetch_loop_bound`` (its KV loop inside the kernel,
the trip count read from a scalar-prefetch operand) with BLOCK_KV = N / trips (at N=1024, blocks
of 128 rows at 8 trips: libtpu 0.0.42.1 crashes compiling 64-row ones, the constant-bound twin's
too); its twin has ``BOUND_FROM_PREFETCH = False``. Every row is two full judgements (correctness
in interpret mode, then the figure): the data-bound one counted on the timing input
(``evaluator/figure/trips.py``). The last column is what the static estimate alone says of the
data-bound loop (``Judge.estimate``: no run, so nothing counted): the guess the judge used to
refuse.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evaluator.judge import Judge, JudgeConfig  # noqa: E402
from evaluator.versions import versions  # noqa: E402
from seeds.flash_attention.task import AttentionTask, parse_shape  # noqa: E402
from tests.judging import judge_all  # noqa: E402

LOOP = ROOT / "tests" / "evaluator" / "adversarial" / "candidates" / "c5_prefetch_loop_bound.py"


def variant(trips: int, seq_len: int, from_prefetch: bool) -> str:
    return LOOP.read_text().replace("BLOCK_KV = 128", f"BLOCK_KV = {seq_len // trips}").replace(
        "BOUND_FROM_PREFETCH = True", f"BOUND_FROM_PREFETCH = {from_prefetch}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="B=1,H=2,N=1024,D=128")
    p.add_argument("--chip", default="v5e")
    p.add_argument("--trips", default="1,2,4,8")
    a = p.parse_args()
    task = AttentionTask(**parse_shape(a.shape))
    judge = Judge(JudgeConfig(chip=a.chip, workers=2))
    counts = [int(t) for t in a.trips.split(",")]
    sources = [variant(t, task.seq_len, bound) for t in counts for bound in (False, True)]
    results = judge_all(judge, sources, task)
    v = versions()
    print(f"task {task.key}, {a.chip}, {results[0].provenance.timing_source}, libtpu {v['libtpu_version']}, "
          f"jax {v['jax_version']}\n")
    print("| real trips | BLOCK_KV | constant bound (cycles) | bound from scalar prefetch, counted (cycles) | ratio "
          "| the static estimate alone, data bound (cycles) |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for i, t in enumerate(counts):
        const, data = results[2 * i], results[2 * i + 1]
        static, _, _ = judge.estimate(sources[2 * i + 1], task)
        if const.status.value != "PASS" or data.status.value != "PASS":
            print(f"| {t} | {task.seq_len // t} | {const.status.value} {const.error[:80]} | "
                  f"{data.status.value} {data.error[:80]} | - | {static or '-'} |")
            worst = float("inf")
            continue
        c, d = const.metrics.estimated_cycles, data.metrics.estimated_cycles
        worst = max(worst, abs(d / c - 1))
        print(f"| {t} | {task.seq_len // t} | {c:,} | {d:,} | {d / c:.3f} | {static:,} |" if static else
              f"| {t} | {task.seq_len // t} | {c:,} | {d:,} | {d / c:.3f} | - |")
    print(f"\nlargest difference: {worst:.1%} (target: within 10%)")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
