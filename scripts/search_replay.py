"""Replay the search under the compiler estimate alone: a design tool for the search itself.

    .venv/bin/python scripts/search_replay.py [--seeds 0,1,2,3,4] [--generations 4] [--niches 2]
        [--chip v5e] [--shape B=1,H=8,N=2048,D=128] [--strategy ga] [--cache FILE] [--start jax]
        [--set tweak_prob=0 ...]

Runs the strategy's ``Search`` exactly as ``evolve run`` does (same breeding, lag 4 as with two
workers, the cascade's cut), but each kernel's verdict is only the judge's estimate
(``Judge.estimate_timing``: trace in the jail, compile, read the figure), with no correctness
stage, cached on disk by kernel id, so that five RNG seeds of a change cost minutes, not an hour.
A compile that runs out of VMEM is FAIL_VMEM, any other failure FAIL_COMPILE. Where every kernel
the search breeds is correct (as here for flash_attention) it reproduces ``evolve run`` kernel for
kernel; it is never a verdict: the project's figures come from ``evolve run`` and ``evolve bench``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import threading
import time
from pathlib import Path

from evaluator.judge import Judge, JudgeConfig
from evaluator.result import EvalResult, Metrics, Status
from evolve.config import JudgeSettings, RunConfig, SearchConfig, TaskConfig
from evolve.start.resolve import resolve_start
from evolve.search.strategies import strategy_class
from mutations import block_values


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", default="flash_attention")
    p.add_argument("--shape", default=None)
    p.add_argument("--chip", default="v5e")
    p.add_argument("--timing", default="auto", help="the judge's timing source (as evolve run --timing)")
    p.add_argument("--seeds", default="0", help="RNG seeds, comma-separated")
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--niches", type=int, default=SearchConfig.niches)
    p.add_argument("--stacked", type=int, default=SearchConfig.stacked)
    p.add_argument("--target", type=int, default=None,
                   help="also print after how many kernels the champion was at most this many cycles")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="another [search] setting, as in the configuration file (e.g. tweak_prob=0)")
    p.add_argument("--strategy", default="ga")
    p.add_argument("--cache", default=None, help="the figures' cache (default /tmp/search-replay-CHIP-TASK.json)")
    p.add_argument("--trace", action="store_true", help="also print every kernel taken: its move and figure")
    p.add_argument("--start", default=None, help="start from this module or file (as evolve run --start)")
    p.add_argument("--dump", default=None, help="write every kernel taken (edits, status, figure) to this JSON file")
    a = p.parse_args()
    settings = {key: json.loads(value) for key, value in (item.split("=", 1) for item in a.set)}
    task_cfg = TaskConfig(seed=a.seed, shape=a.shape, start=a.start)
    task, seed = task_cfg.task(), task_cfg.load_seed()
    source = resolve_start(a.start, seed).for_task(task).source
    path = Path(a.cache or f"/tmp/search-replay-{a.chip}-{task.key.replace('/', '_')}.json")
    cache = json.loads(path.read_text()) if path.exists() else {}
    lock = threading.Lock()
    judge = Judge(JudgeConfig(chip=a.chip, timing=a.timing, workers=2))
    if "reference" not in cache:
        cache["reference"] = judge.estimate_timing(None, task)[0].cycles
    reference = cache["reference"] or 10**9     # no reference figure: speedups are 1e9 / cycles

    def evaluate(ind):
        with lock:
            hit = cache.get(ind.id)
        if hit is None:
            timing, _ = judge.estimate_timing(ind.source, task)
            hit = {"cycles": timing.cycles, "error": timing.error}
            with lock:
                cache[ind.id] = hit
                path.write_text(json.dumps(cache))
        cycles = hit["cycles"]
        if cycles and ind.cut and cycles > ind.cut:
            return EvalResult(Status.PRUNED, metrics=Metrics(estimated_cycles=cycles))
        if cycles:
            return EvalResult(Status.PASS, metrics=Metrics(estimated_cycles=cycles, reference_cycles=reference,
                                                           speedup_vs_reference=reference / cycles))
        vmem = "vmem" in (hit["error"] or "").lower()
        return EvalResult(Status.FAIL_VMEM if vmem else Status.FAIL_COMPILE, error=(hit["error"] or "")[:200])

    def record(ind, result):
        ind.result = result
        ind.fitness.values = (result.metrics.speedup_vs_reference or 0.0,) if result.ok else (0.0,)

    print(f"# {task.key} on {a.chip}, {a.strategy}; estimate only, no correctness check; cache {path}")
    for rng_seed in [int(x) for x in a.seeds.split(",")]:
        config = RunConfig(search=SearchConfig(population=a.population, generations=a.generations,
                                               rng_seed=rng_seed, lag=4, niches=a.niches,
                                               stacked=a.stacked, **settings),
                           task=task_cfg, judge=JudgeSettings(chip=a.chip))
        search = strategy_class(a.strategy)(config, source, task, evaluate=evaluate, record=record)
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(2) as executor:
            champion = search.run(executor)
        reached = next((i + 1 for i, ind in enumerate(search.taken) if a.target and ind.passed
                        and ind.result.metrics.estimated_cycles <= a.target), None)
        if a.trace:
            for i, ind in enumerate(search.taken, 1):
                m = ind.result.metrics
                shape = {k: v for k, v in block_values(ind.source, task).items()}
                print(f"  {i:3d} gen {ind.generation} {ind.operator:18s} {ind.result.status.value:12s} "
                      f"{m.estimated_cycles or '-':>9} {shape} {[e['op'] for e in ind.edits]}")
        if a.dump:
            Path(a.dump).write_text(json.dumps([
                {"id": ind.id, "operator": ind.operator, "generation": ind.generation, "edits": ind.edits,
                 "status": ind.result.status.value, "cycles": ind.result.metrics.estimated_cycles}
                for ind in search.taken], indent=1, default=str))
        edits = " -> ".join(e["op"] + (f"{e['params']}" if e.get("params") else "") for e in champion.edits)
        print(f"RNG seed {rng_seed}: champion {champion.result.metrics.estimated_cycles:,} cycles after "
              f"{len(search.taken)} kernels ({time.monotonic() - start:.0f} s)"
              + (f", target reached after {reached or '>' + str(len(search.taken))}" if a.target else "")
              + f": {edits}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
