"""Kernels judged per minute by one executor: the same search (task, budget, RNG seed) in a fresh
data directory, so every kernel is judged and none comes from an archive.

    .venv/bin/python scripts/executor_rate.py --executor local --cpus 2 --budget 12
    .venv/bin/python scripts/executor_rate.py --executor ray --cpus 2 --budget 12   # a Ray of 2 CPUs, started here

The clock runs over the search alone: the executor is opened first (a Ray start is not counted,
a Ray worker's first task, which loads the judge, is), and the reference is timed before it (both
executors time it once, here). Peers are off. Prints one line of figures, and --json one document.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time



def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--executor", choices=("local", "ray"), default="local")
    p.add_argument("--cpus", type=int, default=2, help="judges at once (Ray: a local Ray of this many CPUs)")
    p.add_argument("--budget", type=int, default=12, help="distinct kernels to judge")
    p.add_argument("--seed", default="examples/seed_axpy")
    p.add_argument("--shape", default="M=256,N=256")
    p.add_argument("--rng-seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    from evolve.config import JudgeSettings, RunConfig, SearchConfig, TaskConfig
    from evolve.executors.base import open_executor
    from evolve.run import EvolutionRun

    config = RunConfig(search=SearchConfig(budget=args.budget, rng_seed=args.rng_seed),
                       task=TaskConfig(seed=args.seed, shape=args.shape),
                       judge=JudgeSettings(workers=args.cpus, peers=False, executor=args.executor))
    with tempfile.TemporaryDirectory(prefix="executor-rate-") as data, open_executor(config.judge) as executor:
        run = EvolutionRun(config, data, executor=executor)
        run.judge.reference_timing(run.task)           # not on the clock, for either executor
        start = time.monotonic()
        run.start()
        minutes = (time.monotonic() - start) / 60
        statuses = [ind.result.status.value for ind in run.search.taken]
    figures = {"executor": args.executor, "cpus": args.cpus, "task": run.task.key, "budget": args.budget,
               "judged": run.progress.judged, "minutes": round(minutes, 3),
               "kernels_per_minute": round(run.progress.judged / minutes, 2),
               "passed": statuses.count("PASS")}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{args.executor} x{args.cpus}: {figures['judged']} kernels of {figures['task']} in "
              f"{minutes:.2f} min = {figures['kernels_per_minute']:.2f} kernels/min ({figures['passed']} PASS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
