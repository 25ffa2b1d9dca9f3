"""What the TPU compiler's schedule of a kernel keeps busy: per functional unit, the share of the
kernel's scheduled bundles (VLIW instruction words) that use it, beside the static cycle estimate.

    .venv/bin/python scripts/unit_mix.py KERNEL.py [KERNEL.py ...] [--chip v5e] [--shape B=1,H=8,N=2048,D=128]

libtpu writes a per-bundle utilisation table of every op it compiles when ``--xla_jf_dump_to`` and
``--xla_jf_dump_llo_text`` are set (internal flags of libtpu 0.0.42.1; when the table does not
appear we say so). The shares are over the *static* code: a bundle inside a loop counts once,
however many times it runs, so they show what the loop bodies are made of (e.g. how much of the
schedule is spent storing spilled vector registers), not a time breakdown. The estimate is the
judge's.

Each kernel is imported and compiled in a child process of this script, outside the judge's
sandbox: use it on files you trust (a promoted champion, a seed, an archived source you read).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


_TABLE = "*final_hlo-static-per-bundle-utilization.txt"


def parse_utilisation(text: str) -> dict:
    """{'bundles': n, 'units': {unit: (share of bundles using it, share of its slots used)}}."""
    lines = text.splitlines()
    at = lines.index("== CAPACTIY:") if "== CAPACTIY:" in lines else lines.index("== CAPACITY:")
    names = lines[at + 1].replace(",", " ").split()
    capacity = [int(c) for c in lines[at + 2].split()]
    rows = [[int(x) for x in line.split()] for line in lines[at + 4:]
            if line.strip() and line.split()[0].isdigit() and len(line.split()) == len(names)]
    n = len(rows)
    units = {name: (sum(1 for r in rows if r[i]) / n, sum(r[i] for r in rows) / (n * capacity[i]))
             for i, name in enumerate(names)} if n else {}
    return {"bundles": n, "units": units}


def _compile_one(path: str, chip: str, shape: str, dump: str) -> dict:
    """In the child: compile PATH for CHIP with the dumps on, then read them back."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from evaluator.figure.timing.compiler_estimate import read_cycles
    from seeds.flash_attention.task import AttentionTask, parse_shape

    task = AttentionTask(**parse_shape(shape))
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    device = topologies.get_topology_desc(topology_name=f"{chip}:2x2", platform="tpu").devices[0]
    arg = jax.ShapeDtypeStruct(task.shape, jnp.dtype(task.dtype), sharding=SingleDeviceSharding(device))
    fn = jax.jit(lambda q, k, v: module.flash_attention(q, k, v, causal=task.causal, sm_scale=task.sm_scale))
    fn.lower(arg, arg, arg).compile()
    cycles, why = read_cycles(Path(dump) / "llo")
    tables = sorted((Path(dump) / "jf").glob(_TABLE), key=lambda p: p.stat().st_size)
    if not tables:
        return {"error": "libtpu wrote no per-bundle utilisation table (needs libtpu 0.0.42.1's dump flags)"}
    # The largest table is the kernel's custom call; the others are small ops around it.
    return {"cycles": cycles, "cycles_error": why, **parse_utilisation(tables[-1].read_text())}


def measure(path: str, chip: str, shape: str) -> dict:
    with tempfile.TemporaryDirectory() as dump:
        env = dict(os.environ, LIBTPU_INIT_ARGS=(
            f"--xla_jf_dump_static_llo_profile_to={dump}/llo --xla_jf_dump_to={dump}/jf "
            "--xla_jf_dump_llo_text=true"),)
        proc = subprocess.run([sys.executable, __file__, "--child", path, "--chip", chip, "--shape", shape,
                               "--dump", dump], env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"compile failed (exit {proc.returncode}): {tail}"}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", nargs="+")
    parser.add_argument("--chip", default="v5e", choices=["v5e", "v6e"])
    parser.add_argument("--shape", default="B=1,H=8,N=2048,D=128")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_compile_one(args.kernels[0], args.chip, args.shape, args.dump)))
        return 0
    for path in args.kernels:
        if not Path(path).is_file():
            print(f"error: {path} is not a file; pass kernel files (e.g. seeds/flash_attention/kernel.py)",
                  file=sys.stderr)
            return 2
    from evaluator.versions import versions
    v = versions()
    print(f"# {args.shape} on {args.chip}, libtpu {v['libtpu_version']}: share of each kernel's static "
          "bundles that use a unit (slot share in brackets); not weighted by loop trip counts")
    results = {path: measure(path, args.chip, args.shape) for path in args.kernels}
    units = next((list(r["units"]) for r in results.values() if r.get("units")), [])
    print("| kernel | estimated cycles | bundles | " + " | ".join(units) + " |")
    print("|---|---|---|" + "---|" * len(units))
    for path, r in results.items():
        if "error" in r:
            print(f"| {path} | {r['error']} |")
            continue
        cells = [f"{busy:.0%} ({slots:.0%})" for busy, slots in r["units"].values()]
        cycles = f"{r['cycles']:,}" if r["cycles"] is not None else r["cycles_error"]
        print(f"| {path} | {cycles} | {r['bundles']:,} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
