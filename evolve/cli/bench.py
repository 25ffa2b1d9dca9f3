"""`evolve bench`: strategies (ga, ratchet, random) side by side, same task, budget and judge; or,
with ``--suite``, the search on a suite of tasks at once (evolve/experiments/suite.py)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from evolve.cli.common import Command
from evolve.errors import UsageError


class BenchCommand(Command):
    name = "bench"
    help = "search strategies side by side on one task and budget"
    description = ("Search strategies side by side on one task, budget and judge; every strategy shares "
                   "the archive of --data-dir (a kernel one strategy judged is read back for the others).")
    parents = ("data_dir", "task", "executor", "start")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--strategies", default="ga,ratchet,random", help="comma-separated: ga, ratchet, random")
        parser.add_argument("--budget", type=int, default=32,
                            help="distinct kernels per strategy and repeat (default 32)")
        parser.add_argument("--repeats", type=int, default=5,
                            help="runs per strategy, RNG seeds base..base+R-1 (default 5: a median and quartiles)")
        parser.add_argument("--rng-seed", type=int, default=None, help="the first repeat's RNG seed (default 0)")
        parser.add_argument("--out", default=None, help="where to write bench.md, bench.png, bench.json "
                                                        "(default DATA_DIR/bench/BENCH_ID)")
        parser.add_argument("--suite", nargs="?", const="default", default=None, metavar="NAME",
                            help="the search (ga, default budget) on every task of a suite (default: "
                                 "'default'), each beside its peers; kernels cached in DATA_DIR/suite/JUDGE")
        parser.add_argument("--write", action="append", default=[], metavar="PAGE",
                            help="with --suite: put the table between <!-- suite:begin --> and "
                                 "<!-- suite:end --> in PAGE (repeatable), with the commit and the command")

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.cli.run import _config_from_args
        from evolve.cli.store import archive_at
        from evolve.executors.base import open_executor
        from evolve.start.resolve import resolve_start
        from evolve.search.strategies import strategy_class

        if args.budget < 1:
            raise UsageError(f"--budget must be at least 1 kernel, got {args.budget}")
        if args.suite is not None:
            return self._suite(args)
        if args.write:
            raise UsageError("--write goes with --suite; use --out for a strategies bench's report")
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
        if not strategies:
            raise UsageError("--strategies is empty; give one or more of ga, ratchet, random")
        for name in strategies:
            strategy_class(name)
        if args.repeats < 1:
            raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
        args.population = args.generations = args.prune_factor = args.lag = args.config = None
        args.peers = True
        base = _config_from_args(args)
        base = dataclasses.replace(base, search=dataclasses.replace(base.search, budget=args.budget))
        base.task.task()
        resolve_start(base.task.start, base.task.load_seed())    # a bad --start: one line, nothing stored
        archive_at(args.data_dir, create=True)
        with open_executor(base.judge) as executor:     # one for every trial
            return self._bench(args, base, strategies, executor)

    def _bench(self, args: argparse.Namespace, base, strategies: list[str], executor) -> int:
        from evolve.experiments.bench import format_table, run_trial, summarise, write_report
        from evolve.run import new_run_id

        bench_id = "bench-" + new_run_id()
        trials, meta = [], None
        out = Path(args.out) if args.out else Path(args.data_dir) / "bench" / bench_id
        for repeat in range(args.repeats):
            for name in strategies:
                config = dataclasses.replace(
                    base, search=dataclasses.replace(base.search, rng_seed=base.search.rng_seed + repeat),
                    # JAX's tuned kernel is judged once, beside the first trial.
                    judge=dataclasses.replace(base.judge, peers=not trials))
                print(f"{bench_id}: {name}, repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
                trial, run = run_trial(config, args.data_dir, f"{bench_id}-{name}-r{repeat}", name, repeat,
                                       executor=executor)
                trials.append(trial)
                if meta is None:
                    meta = {"bench_id": bench_id, "budget": args.budget, "repeats": args.repeats,
                            "strategies": strategies, "task_key": run.task.key, "chip": run.prov.chip,
                            "timing_source": run.prov.timing_source, "libtpu_version": run.prov.libtpu_version,
                            "config": config.to_dict(),
                            "peers": {k: {"status": r.status.value,
                                          "speedup_vs_reference": r.metrics.speedup_vs_reference,
                                          "estimated_cycles": r.metrics.estimated_cycles}
                                      for k, r in run.peers.items()}}
                # The report is rewritten after every trial: a bench stopped part way keeps what it has.
                summary = summarise(trials, args.budget)
                paths = write_report(out, trials, summary, meta)
        print(f"\n{bench_id}  task {meta['task_key']}  timing: {meta['timing_source']} (chip {meta['chip']}, "
              f"libtpu {meta['libtpu_version']})")
        print(format_table(summary, args.budget))
        for name, peer in meta["peers"].items():
            if peer["speedup_vs_reference"]:
                print(f"{name}: {peer['speedup_vs_reference']:.3f}x the XLA reference "
                      f"({peer['estimated_cycles'] or '-'} cycles), same judge")
        print(f"table: {paths['table']}  plot: {paths['plot']}  data: {paths['json']}")
        return 0

    def _suite(self, args: argparse.Namespace) -> int:
        from evolve.experiments import suite as S
        from evolve.run import new_run_id

        given = [f"--{k.replace('_', '-')}" for k in ("seed", "chip", "shape", "causal", "dtype", "chips", "start",
                                                     "reference", "entry")
                 if getattr(args, k, None) is not None]
        if given:
            raise UsageError(f"--suite runs its own tasks; drop {', '.join(given)} (or run evolve run for one task)")
        tasks = S.suite_tasks(args.suite)
        pages = [Path(p) for p in args.write]
        for page in pages:        # before any run: a bad page costs nothing
            S.page_text(page)
        fingerprint = S.judge_fingerprint()
        data_dir = Path(args.data_dir) / "suite" / fingerprint
        data_dir.mkdir(parents=True, exist_ok=True)
        base = S.default_config(args.rng_seed or 0, args.workers or 0)
        base = dataclasses.replace(base, search=dataclasses.replace(base.search, budget=args.budget),
                                   judge=dataclasses.replace(base.judge, executor=args.executor or base.judge.executor))
        suite_id = "suite-" + new_run_id()
        commit = _commit()               # the code the suite runs (as it starts: a commit made meanwhile is not it)
        outcomes = []
        started = time.monotonic()
        for i, item in enumerate(tasks):
            print(f"{suite_id}: {item.label} ({i + 1}/{len(tasks)})", file=sys.stderr)
            outcomes.append(S.run_task(item, base, data_dir, f"{suite_id}-{i}"))
        minutes = (time.monotonic() - started) / 60
        table = S.format_suite(outcomes, args.budget)
        command = f"evolve bench --suite {args.suite}" + (f" --budget {args.budget}" if args.budget != 32 else "")
        judged = sum(o.judged for o in outcomes)

        def block(page: Path | None) -> str:
            # The README holds no commit (its history is docs/history.md); a docs page keeps it.
            at = "" if page is not None and page.name == "README.md" else f" at commit `{commit}`"
            judge = "" if at == "" else f"; judge {fingerprint}"
            return (f"Suite `{args.suite}`{at}, regenerated by `{command} --write PAGE` ({minutes:.1f} min on "
                    f"this machine, {judged} kernels judged, the rest from the suite's archive{judge}):\n\n{table}")
        out = Path(args.out) if args.out else data_dir / "reports" / suite_id
        paths = S.write_suite(out, outcomes, {"suite": args.suite, "suite_id": suite_id, "commit": commit,
                                              "judge": fingerprint, "minutes": minutes}, table)
        for page in pages:
            S.write_into(page, block(page))
        print(f"\n{block(None)}\n\ntable: {paths['table']}  data: {paths['json']}  runs: {data_dir}")
        return 0 if all(o.status == "ok" for o in outcomes) else 1


def _commit() -> str:
    """The project's commit (with ``+dirty`` when files differ from it), or ``unknown``."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


COMMANDS = (BenchCommand,)
