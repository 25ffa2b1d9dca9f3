"""Figures at a shape too large to check on a CPU: the judge's estimate only, side by side.

    .venv/bin/python scripts/estimate_only.py --seed flash_decoding [--shape ...] [--chip v5e] \
        [--ablation ABLATE.json] [KERNEL.py ...]

For each kernel (the seed's own kernel always; every kernel file given; with ``--ablation``, the
fastest PASS row of an ``evolve ablate --format json`` output, rebuilt by replaying its edits on
the seed), and for the task's own XLA program, prints the timing source's figure: cycles (and the
compiler's compute estimate and the HBM-traffic floor they are the larger of), latency, HBM
bandwidth utilisation of the task's unavoidable bytes, and the speedup over the XLA program.

Nothing here checks correctness: the judge does that (``evolve eval``, ``evolve ablate``) at a
shape a CPU can check; use this for the same sources at the shape that matters. A kernel whose
audit finds a construct the estimate cannot count is printed as refused, as the judge would.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from evaluator.judge import Judge, JudgeConfig
from evaluator.figure.roofline import roofline
from evaluator.versions import versions
from evolve.experiments.decode_bench import best_chain
from mutations import replay
from seeds import load_seed


def _ablation_best(path: Path, seed, task) -> tuple[str, str]:
    label, edits = best_chain(path)      # what decode-bench replays too
    result = replay(seed.kernel_source, edits, task)
    if not result.applied:
        raise SystemExit(f"estimate_only: the ablation's best does not replay at {task.key}: {result.reason}")
    return label, result.source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", nargs="*", type=Path)
    parser.add_argument("--seed", default="flash_decoding")
    parser.add_argument("--shape", default=None)
    parser.add_argument("--chip", default="v5e")
    parser.add_argument("--ablation", type=Path, default=None)
    args = parser.parse_args()
    seed = load_seed(args.seed)
    task = seed.task(args.shape)
    judge = Judge(JudgeConfig(chip=args.chip, workers=1))
    v = versions()
    entries = [("seed kernel", seed.kernel_source)]
    if args.ablation:
        entries.append(_ablation_best(args.ablation, seed, task))
    entries += [(str(p), p.read_text()) for p in args.kernels]
    print(f"# {task.key} on {args.chip}; timing source {judge.timing.label or judge.timing.name}, "
          f"libtpu {v['libtpu_version']}, jax {v['jax_version']}; estimate only, no correctness check")
    reference, _ = judge.estimate_timing(None, task)
    rows = [("XLA reference (the task's own program)", reference, [])]
    rows += [(label, *judge.estimate_timing(source, task)) for label, source in entries]
    print("| kernel | cycles | compute estimate | HBM floor | latency (us) | HBM util | vs XLA reference |")
    print("|---|---|---|---|---|---|---|")
    for label, timing, findings in rows:
        blind = [f["construct"] for f in findings if f.get("construct") in judge.timing.blind_spots]
        if timing.latency_s is None or blind:
            why = f"refused: {', '.join(blind)}" if blind else timing.error.split(";")[0][:80]
            print(f"| {label} | {why} | | | | | |")
            continue
        roof = roofline(task.flops, task.bytes_moved, timing.latency_s, judge.chip)
        speedup = f"{reference.latency_s / timing.latency_s:.3f}x" if reference.latency_s else "n/a"
        print(f"| {label} | {timing.cycles:,} | {timing.compute_cycles or 0:,} | {timing.hbm_cycles or 0:,} | "
              f"{timing.latency_s * 1e6:.1f} | {roof.hbm_util:.0%} | {speedup} |")
    if reference.note:
        print(f"\nreference: {reference.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
