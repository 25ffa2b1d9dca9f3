"""`evolve run | resume | status`: runs as users meet them (lineage, sync, ui, promote: cli/lineage.py).

Every one of them works on the data directory (--data-dir, shared: evolve.cli.common)."""

from __future__ import annotations

import argparse
import sys

from evolve.cli.common import (Command, add_executor_arguments, add_json_alias, evolve_command, one_task,
                               print_json, seed_timing)
from evolve.cli.store import archive_at, champion_chain, champion_line, lineage_json, number, run_meta
from evolve.errors import UsageError


def _config_from_args(args: argparse.Namespace):
    """The run's configuration: the file's, the flags over it; the seed's timing source where
    neither names one (seed_timing)."""
    import dataclasses

    from evolve.config import load_config

    one_task(args)
    config = load_config(args.config, {
        "search": {"population": args.population, "generations": args.generations,
                   "rng_seed": args.rng_seed, "prune_factor": args.prune_factor, "lag": args.lag},
        "task": {"seed": args.seed, "shape": args.shape, "causal": args.causal,
                 "dtype": getattr(args, "dtype", None), "chips": getattr(args, "chips", None),
                 "start": getattr(args, "start", None), "reference": getattr(args, "reference", None),
                 "entry": getattr(args, "entry", None)},
        "judge": {"chip": args.chip, "workers": args.workers, "peers": args.peers,
                  "timing": getattr(args, "timing", None), "executor": args.executor,
                  "ray_address": args.ray_address, "memory_gib": getattr(args, "memory", None)},
    })
    timing = seed_timing(config.task.load_seed()) if config.judge.timing == "auto" and \
        getattr(args, "timing", None) is None else None
    return dataclasses.replace(config, judge=dataclasses.replace(config.judge, timing=timing)) if timing else config


def served(config, executor, data_dir: str):
    """``config``, its task started from the built-in seed that serves its reference file best when
    it brings no kernel (evolve/start/serve.py), judged by ``executor``; the seeds tried are
    printed. UsageError when none passes."""
    import dataclasses

    from evaluator import Judge
    from evolve.start.serve import serve, served_config, serving_memory, wants_serving

    if not wants_serving(config.task):
        return config
    if not config.judge.memory_gib:
        config = dataclasses.replace(config, judge=dataclasses.replace(config.judge, memory_gib=serving_memory()))
    made: list = []

    def judging(task):
        made[:] = made or [Judge(config.judge.judge_config(data_dir))]
        return executor.judging(made[0], task)

    found = serve(config.task, judging, progress=lambda line: print(line, file=sys.stderr, flush=True))
    task = served_config(config.task, found)
    print(found.report(), file=sys.stderr)
    return dataclasses.replace(config, task=task)


def with_executor(config, executor: str | None, ray_address: str | None):
    """A stored run's configuration, judged where --executor / --ray-address now say (a Ray address
    stored with the run is kept only while the executor stays ray)."""
    import dataclasses

    judge = config.judge
    name = executor or judge.executor
    address = ray_address if ray_address is not None else (judge.ray_address if name == "ray" else "")
    return dataclasses.replace(config, judge=dataclasses.replace(judge, executor=name, ray_address=address))


NO_PASS_EXIT = 3     # the run ended cleanly, its report printed, but no kernel passed the judge


def _report(run, champion) -> int:
    """Print the run's report; its exit status: 0, or NO_PASS_EXIT when no kernel passed."""
    from archive import edit_label
    from evolve.run import lineage_rows

    print(f"\nrun {run.run_id}  task {run.task.key}  timing: {run.prov.timing_source} "
          f"(chip {run.prov.chip}, libtpu {run.prov.libtpu_version})")
    print(f"start: {run.start_from.label}")
    if champion is None:
        print("\n".join(run.no_pass.lines()) if run.no_pass is not None else "no kernel passed the judge")
        return NO_PASS_EXIT
    chain = lineage_rows(run.archive, run.run_id, champion.id)
    seed = chain[0] if chain else None
    seed_latency = number(seed.get("latency_s")) if seed is not None else None    # None: the seed failed
    m = champion.result.metrics
    one_chip = " on 1 chip" if getattr(run.task, "chips", 1) > 1 else ""
    rows = [(f"reference (XLA{one_chip})", m.reference_latency_s, 1.0)] if m.reference_latency_s else []
    if seed_latency:
        rows.append(("seed", seed_latency, number(seed.get("speedup_vs_reference"))))
    rows.append((f"champion {champion.id}", m.latency_s, m.speedup_vs_reference))
    for name, peer in run.peers.items():
        if peer.ok:
            rows.append((name, peer.metrics.latency_s, peer.metrics.speedup_vs_reference))
        else:
            print(f"peer {name}: {peer.status.value}: {peer.error}")
    print(f"{'kernel':<28} {'latency (us)':>14} {'vs reference':>13} {'vs seed':>9}")
    for name, lat, sp in rows:
        vs_seed = f"{seed_latency / lat:.2f}x" if seed_latency and lat else "-"
        vs_ref = f"{sp:.3f}x" if sp else "-"
        print(f"{name:<28} {lat * 1e6 if lat else float('nan'):>14.1f} {vs_ref:>13} {vs_seed:>9}")
    if seed is not None and not seed_latency:
        print(f"the seed itself did not pass ({seed.get('status')}); 'vs seed' is not given")
    if not m.reference_latency_s:
        print(f"no speedup over the XLA reference: {champion.result.error or 'the judge has no figure for it'}")
    for name, peer in run.peers.items():
        if peer.ok and peer.metrics.latency_s and m.latency_s:
            ratio = peer.metrics.latency_s / m.latency_s
            print(f"champion vs {name}: {ratio:.3f}x ({m.estimated_cycles or '-'} vs "
                  f"{peer.metrics.estimated_cycles or '-'} cycles, same judge, same run)")
    print("edits: " + (" -> ".join(edit_label(r) for r in chain[1:]) or "(the seed itself)"))
    search = getattr(run, "search", None)
    for generation, failed in _failed_generations(getattr(search, "taken", [])):
        print(f"generation {generation}: no kernel passed ({failed}); the search bred on from those that passed before")
    taken, total = len(getattr(search, "taken", [])), run.config.search.total()
    if search is not None and 0 < taken < total:
        print(f"judged {taken} of the budget's {total} kernels: for the rest the operators offered none not "
              "judged already, nor one that differs from a judged kernel only in its VMEM limit (one figure): "
              "the space their moves span from this kernel is that small")
    evolve = evolve_command()
    print(f"browse:  {evolve} ui --data-dir {run.data_dir}\n"
          f"lineage: {evolve} lineage {champion.id} --data-dir {run.data_dir}\n"
          f"promote: {evolve} promote {run.run_id} --data-dir {run.data_dir}")
    return 0


def _failed_generations(taken) -> list[tuple[int, str]]:
    """The generations none of whose kernels passed, each with its statuses counted (``FAIL_VMEM 3, CRASH 1``)."""
    by_generation: dict[int, dict[str, int]] = {}
    for ind in taken:
        counts = by_generation.setdefault(ind.generation, {})
        status = ind.result.status.value if ind.result is not None else "-"
        counts[status] = counts.get(status, 0) + 1
    return [(g, ", ".join(f"{status} {n}" for status, n in counts.items()))
            for g, counts in sorted(by_generation.items()) if "PASS" not in counts]


class RunCommand(Command):
    name = "run"
    help = "start an evolution run"
    parents = ("data_dir", "task", "timing", "executor", "start")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        p = parser
        p.add_argument("--population", type=int, default=None)
        p.add_argument("--generations", type=int, default=None)
        p.add_argument("--rng-seed", type=int, default=None)
        p.add_argument("--prune-factor", type=float, default=None,
                       help="prune (skip correctness for) children estimated slower than this times the "
                            "champion; 0: off (default 2)")
        p.add_argument("--lag", type=int, default=None,
                       help="child i is bred from the results of items up to i - lag (default: twice the "
                            "workers); 1 breeds one at a time")
        p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                       help="judge JAX's tuned kernel side by side (default on)")
        p.add_argument("--config", default=None, help="a TOML file with [search], [task], [judge] tables")

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.cli.eval import check_tiling, left_out
        from evolve.executors.base import open_executor
        from evolve.run import EvolutionRun
        from evolve.start.resolve import resolve_start

        config = _config_from_args(args)
        with open_executor(config.judge) as executor:
            config = served(config, executor, args.data_dir)
            task = config.task.task()
            source = resolve_start(config.task.start, config.task.load_seed()).for_task(task).source
            check_tiling(source, task)
            note = left_out(source, task)
            if note:
                print(note, file=sys.stderr)
            archive_at(args.data_dir, create=True)
            run = EvolutionRun(config, args.data_dir, executor=executor)
            print(f"run {run.run_id}: {config.search.population} individuals x {config.search.generations} "
                  f"generations on {run.task.key}, chip {config.judge.chip}, data in {args.data_dir}; "
                  f"judged {executor.describe()}", file=sys.stderr)
            return _report(run, run.start())


class ResumeCommand(Command):
    name = "resume"
    help = "continue a run that was interrupted"
    parents = ("data_dir",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run")
        add_executor_arguments(parser)

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.config import RunConfig
        from evolve.executors.base import open_executor
        from evolve.run import EvolutionRun
        from evolve.start.resolve import check_same_start, resolve_start

        archive = archive_at(args.data_dir)
        meta = run_meta(archive, args.run)
        config = with_executor(RunConfig.stored(meta["config"]), args.executor, args.ray_address)
        check_same_start(meta.get("start"), resolve_start(config.task.start, config.task.load_seed()), args.run)
        with open_executor(config.judge) as executor:
            run = EvolutionRun(config, args.data_dir, run_id=args.run, strategy=meta.get("strategy", "ga"),
                               executor=executor)
            print(f"resuming {args.run}; judged {executor.describe()}", file=sys.stderr)
            return _report(run, run.resume())


class StatusCommand(Command):
    name = "status"
    help = "list runs, or one run's generations and champion"
    description = ("Without RUN: every run in the data directory. With RUN: its generations, its champion "
                   "and where its worker time went. --format json: one JSON document (a list of runs, or "
                   "the run's record).")
    parents = ("data_dir", "format")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run", nargs="?")
        parser.add_argument("--ids", action="store_true",
                            help="list the run's individuals (ids for 'evolve lineage')")
        add_json_alias(parser, help="print one JSON document instead of tables (the same as --format json)")

    def take_action(self, args: argparse.Namespace) -> int:
        archive = archive_at(args.data_dir)
        if args.ids and not args.run:
            raise UsageError("--ids lists one run's individuals; give the run: 'evolve status RUN --ids'")
        if not args.run:
            runs = archive.runs()
            if args.format == "json":
                print_json(runs.to_dict("records"))
            else:
                import pandas as pd

                pd.set_option("display.width", 160)
                print(runs.to_string(index=False) if not runs.empty else "no runs yet")
            return 0
        meta = run_meta(archive, args.run)
        df = archive.evaluations(args.run)
        if args.format == "json":
            print_json(self.run_document(archive, args.run, meta, df, ids=args.ids))
            return 0
        return self.print_run(archive, args.run, meta, df, ids=args.ids)

    @staticmethod
    def _generations(df):
        return df.groupby("generation").agg(
            evaluations=("individual_id", "size"),
            passed=("status", lambda s: int((s == "PASS").sum())),
            best_speedup=("speedup_vs_reference", "max"),
            median_speedup=("speedup_vs_reference", "median"))

    @staticmethod
    def _individuals(df):
        first = df.drop_duplicates("individual_id", keep="first")
        cols = [c for c in ("individual_id", "generation", "status", "speedup_vs_reference", "operator")
                if c in first.columns]
        return first[cols]

    def print_run(self, archive, run_id: str, meta: dict, df, *, ids: bool) -> int:
        import pandas as pd

        from evolve.experiments.stages import format_breakdown

        pd.set_option("display.width", 160)
        if df.empty:
            print(f"run {run_id} has no evaluations yet")
            return 0
        sources = ", ".join(sorted(df["timing_source"].dropna().unique())) or "-"
        print(f"run {run_id} (timing source: {sources})")
        if ids:
            print(self._individuals(df).to_string(index=False))
            return 0
        print(self._generations(df).to_string())
        print()
        print(champion_line(archive, run_id, meta))
        print()
        workers = (meta.get("config", {}).get("judge", {}) or {}).get("workers") or None
        print(format_breakdown(df, workers=workers))
        return 0

    def run_document(self, archive, run_id: str, meta: dict, df, *, ids: bool) -> dict:
        """The run as one JSON object: its record, generations, champion and seconds per stage."""
        from evolve.experiments.stages import stage_seconds

        champion_id, chain = champion_chain(archive, run_id, meta)
        champion = None
        if champion_id:
            steps = lineage_json(chain)
            last = steps[-1] if steps else {}
            champion = {"individual_id": champion_id,
                        **{k: last.get(k) for k in ("generation", "status", "estimated_cycles", "latency_s",
                                                    "speedup_vs_reference", "timing_source", "chip")},
                        "edits": [s["edit"] for s in steps[1:]]}
        generations = [] if df.empty else [
            {"generation": int(g), **row} for g, row in self._generations(df).to_dict("index").items()]
        judged = df[~df["from_archive"].fillna(False).astype(bool)] if "from_archive" in df.columns else df
        doc = {"run_id": run_id, "status": meta.get("status"), "task_key": meta.get("task_key"),
               "strategy": meta.get("strategy"), "chip": meta.get("chip"),
               "timing_sources": sorted(df["timing_source"].dropna().unique()) if not df.empty else [],
               "evaluations": len(df), "judged": len(judged),
               "by_status": {str(k): int(v) for k, v in sorted(judged["status"].value_counts().items())}
               if len(judged) else {},
               "generations": generations, "champion": champion, "no_pass": meta.get("no_pass"),
               "peers": meta.get("peers") or {},
               "stage_seconds": stage_seconds(df) if not df.empty else {}}
        if ids:
            doc["individuals"] = [] if df.empty else self._individuals(df).to_dict("records")
        return doc


COMMANDS = (RunCommand, ResumeCommand, StatusCommand)
