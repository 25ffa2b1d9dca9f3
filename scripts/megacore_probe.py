"""Which chips with two TensorCores libtpu compiles for here, and what "parallel" is worth there.

    .venv/bin/python scripts/megacore_probe.py [--topologies v5p:2x2x1,v4:2x2x1,v7x:2x2x1,v5e:2x2]

For each topology, a tiled 4096-cube bf16 matmul (512 blocks, an f32 scratch accumulator) is
compiled ahead of time twice, its two outer grid axes "parallel" and then "arbitrary", each in a
child process of its own with libtpu's static profile dumped, and the compiler's estimated cycles
are printed beside the chip's device kind and cores per chip. A topology libtpu refuses, or whose
profiler aborts, is printed as such. No TPU is needed; nothing here is a verdict on a kernel.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

CHILD = r'''
import sys
import jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import SingleDeviceSharding

name, semantics = sys.argv[1], sys.argv[2]
try:
    dev = topologies.get_topology_desc(topology_name=name, platform="tpu").devices[0]
except Exception as exc:  # noqa: BLE001
    print("REFUSED", " ".join(str(exc).split())[:160]); sys.exit(0)
print("DEVICE", dev.device_kind, "|", getattr(dev, "num_cores", "?"), flush=True)
M, B = 4096, 512

def kernel(x_ref, y_ref, o_ref, acc):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc[...] = jnp.zeros_like(acc)
    acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc[...].astype(o_ref.dtype)

def matmul(x, y):
    return pl.pallas_call(
        kernel, grid=(M // B, M // B, M // B),
        in_specs=[pl.BlockSpec((B, B), lambda i, j, k: (i, k)), pl.BlockSpec((B, B), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((B, B), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, M), jnp.bfloat16),
        scratch_shapes=[pltpu.VMEM((B, B), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=(semantics, semantics, "arbitrary")))(x, y)

spec = jax.ShapeDtypeStruct((M, M), jnp.bfloat16, sharding=SingleDeviceSharding(dev))
jax.jit(matmul).lower(spec, spec).compile()
print("COMPILED", flush=True)
'''


def probe(topology: str, semantics: str) -> tuple[str, int | None]:
    with tempfile.TemporaryDirectory() as dump:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "LIBTPU_INIT_ARGS": f"--xla_jf_dump_static_llo_profile_to={dump}"}
        r = subprocess.run([sys.executable, "-c", CHILD, topology, semantics], capture_output=True, text=True,
                           env=env, timeout=600)
        lines = [line for line in r.stdout.splitlines() if line.split(" ")[0] in ("REFUSED", "DEVICE", "COMPILED")]
        said = {line.split(" ")[0]: line.partition(" ")[2] for line in lines}
        if "REFUSED" in said:
            return "refused: " + said["REFUSED"], None
        if "COMPILED" not in said:
            return f"{said.get('DEVICE', '?')}: compile or profiler aborted (exit {r.returncode})", None
        cycles = [int(c) for p in glob.glob(f"{dump}/*static_llo_profile*")
                  for c in re.findall(r"estimated_cycles: (\d+)", open(p).read())[:1]]
        return said["DEVICE"], max(cycles) if cycles else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topologies", default="v5p:2x2x1,v4:2x2x1,v7x:2x2x1,v5e:2x2")
    a = p.parse_args()
    print("| topology | device kind, cores per chip | parallel | arbitrary | gain |\n|---|---|---|---|---|")
    for topology in a.topologies.split(","):
        (what, par), (_, arb) = probe(topology, "parallel"), probe(topology, "arbitrary")
        gain = f"{arb / par:.2f}x" if par and arb else "-"
        print(f"| {topology} | {what} | {f'{par:,}' if par else '-'} | {f'{arb:,}' if arb else '-'} | {gain} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
