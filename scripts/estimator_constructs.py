"""What libtpu's static estimate does with constructs it cannot see, measured, side by side.

    .venv/bin/python scripts/estimator_constructs.py [--shape B=1,H=2,N=512,D=128]

Each kernel is traced by the judge's own jailed worker, and lowered and compiled by its trusted
runner (with the profile dump), exactly as in an evaluation (``Judge.estimate``), except that
the audit's findings are printed instead of refusing the estimate. The seed and the constructs compute the same
attention, so an honest estimate would give them about the same cycles.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from evaluator.judge import Judge, JudgeConfig
from evaluator.versions import versions
from seeds.flash_attention.task import AttentionTask, parse_shape

ROOT = Path(__file__).resolve().parent.parent

CANDIDATES = ROOT / "tests" / "evaluator" / "adversarial" / "candidates"
LOOP = CANDIDATES / "c5_prefetch_loop_bound.py"


def _variant(path: Path, **constants) -> str:
    source = path.read_text()
    for name, value in constants.items():
        old = next(line for line in source.splitlines() if line.startswith(f"{name} = "))
        source = source.replace(old, f"{name} = {value!r}", 1)
    return source


KERNELS = [
    ("none (the seed)", (ROOT / "seeds" / "flash_attention" / "kernel.py").read_text()),
    ("always-true pl.when on a prefetched flag", (CANDIDATES / "c5_when_on_prefetched_flag.py").read_text()),
    ("XLA fori_loop over heads around a one-head kernel", (CANDIDATES / "c5_xla_loop_over_heads.py").read_text()),
    ("in-kernel KV loop, static bound, BLOCK_KV=128", _variant(LOOP, BOUND_FROM_PREFETCH=False, BLOCK_KV=128)),
    ("in-kernel KV loop, prefetched bound, BLOCK_KV=128", _variant(LOOP, BOUND_FROM_PREFETCH=True, BLOCK_KV=128)),
    ("in-kernel KV loop, static bound, BLOCK_KV=256", _variant(LOOP, BOUND_FROM_PREFETCH=False, BLOCK_KV=256)),
    ("in-kernel KV loop, prefetched bound, BLOCK_KV=256", _variant(LOOP, BOUND_FROM_PREFETCH=True, BLOCK_KV=256)),
    ("host callback (jax.pure_callback)", (CANDIDATES / "c4_pure_callback.py").read_text()),
]


def estimate(judge: Judge, source: str, task: AttentionTask) -> tuple[int | None, list[str], str]:
    cycles, findings, error = judge.estimate(source, task)
    return cycles, [f"{f['construct']} ({f['where']})" for f in findings], error


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="B=1,H=2,N=512,D=128")
    parser.add_argument("--chip", default="v5e")
    args = parser.parse_args()
    task = AttentionTask(**parse_shape(args.shape))
    judge = Judge(JudgeConfig(chip=args.chip, workers=1))
    v = versions()
    print(f"# {task.key} on {args.chip}, compiler estimate, libtpu {v['libtpu_version']}, jax {v['jax_version']}")
    print("| construct | audit finding | estimated cycles | vs the seed |")
    print("|---|---|---|---|")
    base = None
    for label, source in KERNELS:
        cycles, findings, error = estimate(judge, source, task)
        base = base or cycles
        ratio = f"{cycles / base:.2f}x" if cycles and base else error.split(":")[0]
        print(f"| {label} | {', '.join(findings) or 'none'} | {cycles if cycles else '-'} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
