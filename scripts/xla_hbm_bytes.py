"""Where a task's XLA program's HBM bytes come from: XLA's cost analysis, and what the judge takes out.

    .venv/bin/python scripts/xla_hbm_bytes.py --seed rmsnorm [--shape ...] [--chip v5e]

The judge floors every program's figure at its HBM traffic over the chip's bandwidth; for ops
outside Pallas kernels the traffic is XLA's cost analysis ("bytes accessed") less what that
analysis charges for buffers staged in VMEM (evaluator/figure/xla_bytes.py: a copy into ``S(1)``
is charged five times the array for one read of it from HBM). This compiles the task's XLA
program as the judge's runner does (``jax.export``, then ``jit(exported.call)`` on the chip's
ahead-of-time topology) and prints both, with each array XLA copies into VMEM.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluator.chips import get_chip  # noqa: E402
from evaluator.figure.xla_bytes import _ops, arrays, xla_hbm_bytes  # noqa: E402
from seeds import load_seed  # noqa: E402


def staged(hlo: str) -> list[str]:
    """Each ``copy-start`` whose destination is not in HBM, with its size (the judge's own parse)."""
    out = []
    for op, result, operands in _ops(hlo):
        destination = arrays(result)[:1]
        if op == "copy-start" and destination and not destination[0][1]:
            out.append(f"{destination[0][0]:,} bytes of {operands[0].split('{')[0]} copied into VMEM")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", default="rmsnorm")
    parser.add_argument("--shape", default=None)
    parser.add_argument("--chip", default="v5e")
    args = parser.parse_args()
    chip = get_chip(args.chip)
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", chip.accelerator_type)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    import jax
    from jax import export
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    task = load_seed(args.seed).task(args.shape)
    specs = [jax.ShapeDtypeStruct(s, d) for s, d in task.input_specs()]
    exported = export.export(jax.jit(task.reference_program()), platforms=["tpu"])(*specs)
    device = topologies.get_topology_desc(topology_name=chip.topology, platform="tpu").devices[0]
    placed = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=SingleDeviceSharding(device)) for s in specs]
    compiled = jax.jit(exported.call).lower(*placed).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    charged = int(float(analysis.get("bytes accessed", 0.0)))
    hlo = compiled.as_text()
    kept = xla_hbm_bytes(charged, hlo)

    def cycles(n: int) -> int:
        return math.ceil(n / chip.hbm_bytes_per_s * chip.clock_hz)

    print(f"# {task.key}: its XLA program on {args.chip} (jax {jax.__version__})")
    for line in staged(hlo):
        print(f"  staged: {line}")
    print(f"XLA's cost analysis:               {charged:,} bytes -> HBM floor {cycles(charged):,} cycles")
    print(f"what the judge counts:             {kept:,} bytes -> HBM floor {cycles(kept):,} cycles")
    print(f"charged / judged: {charged / kept:.2f}x" if kept else "no bytes left through HBM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
