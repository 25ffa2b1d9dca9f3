"""`evolve run | resume | status | lineage | sync | ui | promote`: runs as users meet them.

Every one of them works on the data directory (--data-dir, shared: evolve.cli_common)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from evolve.cli_common import Command, add_commands as _add_commands, add_executor_arguments, print_json
from evolve.cli_eval import add_chips_argument
from evolve.errors import UsageError


def _archive(data_dir: str, *, create: bool = False):
    from archive import Archive, ArchiveError

    path = Path(data_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--data-dir {data_dir} is a file, not a directory; give a directory")
    if path.exists() and not os.access(path, os.R_OK | os.X_OK):
        raise UsageError(f"data directory {data_dir} is not readable; fix its permissions or choose "
                         "another --data-dir")
    if not create and not path.is_dir():
        raise UsageError(f"no data directory at {data_dir}; start a run with 'evolve run' or pass "
                         "--data-dir")
    try:
        return Archive(path, create=create)
    except ArchiveError as exc:
        raise UsageError(str(exc)) from None


def _config_from_args(args: argparse.Namespace):
    from evolve.config import load_config

    return load_config(args.config, {
        "search": {"population": args.population, "generations": args.generations,
                   "rng_seed": args.rng_seed, "prune_factor": args.prune_factor, "lag": args.lag},
        "task": {"seed": args.seed, "shape": args.shape, "causal": args.causal,
                 "dtype": getattr(args, "dtype", None), "chips": getattr(args, "chips", None)},
        "judge": {"chip": args.chip, "workers": args.workers, "peers": args.peers,
                  "timing": getattr(args, "timing", None), "executor": args.executor,
                  "ray_address": args.ray_address},
    })


def with_executor(config, executor: str | None, ray_address: str | None):
    """A stored run's configuration, judged where --executor / --ray-address now say (a Ray address
    stored with the run is kept only while the executor stays ray)."""
    import dataclasses

    judge = config.judge
    name = executor or judge.executor
    address = ray_address if ray_address is not None else (judge.ray_address if name == "ray" else "")
    return dataclasses.replace(config, judge=dataclasses.replace(judge, executor=name, ray_address=address))


def _report(run, champion) -> None:
    from archive import edit_label
    from evolve.run import lineage_rows

    print(f"\nrun {run.run_id}  task {run.task.key}  timing: {run.prov.timing_source} "
          f"(chip {run.prov.chip}, libtpu {run.prov.libtpu_version})")
    if champion is None:
        print("no kernel passed the judge")
        return
    chain = lineage_rows(run.archive, run.run_id, champion.id)
    seed = chain[0] if chain else None
    m = champion.result.metrics
    one_chip = " on 1 chip" if getattr(run.task, "chips", 1) > 1 else ""
    rows = [(f"reference (XLA{one_chip})", m.reference_latency_s, 1.0)]
    if seed is not None and seed.get("latency_s"):
        rows.append(("seed", seed["latency_s"], seed["speedup_vs_reference"]))
    rows.append((f"champion {champion.id}", m.latency_s, m.speedup_vs_reference))
    for name, peer in run.peers.items():
        if peer.ok:
            rows.append((name, peer.metrics.latency_s, peer.metrics.speedup_vs_reference))
        else:
            print(f"peer {name}: {peer.status.value}: {peer.error}")
    print(f"{'kernel':<28} {'latency (us)':>14} {'vs reference':>13} {'vs seed':>9}")
    for name, lat, sp in rows:
        vs_seed = (f"{seed['latency_s'] / lat:.2f}x" if seed is not None and seed.get("latency_s") and lat
                   else "-")
        print(f"{name:<28} {lat * 1e6 if lat else float('nan'):>14.1f} {sp:>12.3f}x {vs_seed:>9}")
    for name, peer in run.peers.items():
        if peer.ok and peer.metrics.latency_s and m.latency_s:
            ratio = peer.metrics.latency_s / m.latency_s
            print(f"champion vs {name}: {ratio:.3f}x ({m.estimated_cycles or '-'} vs "
                  f"{peer.metrics.estimated_cycles or '-'} cycles, same judge, same run)")
    print("edits: " + (" -> ".join(edit_label(r) for r in chain[1:]) or "(the seed itself)"))
    print(f"browse: evolve ui --data-dir {run.data_dir}    lineage: evolve lineage {champion.id} "
          f"--data-dir {run.data_dir}    promote: evolve promote {run.run_id} --data-dir {run.data_dir}")



def _meta(archive, run_id: str) -> dict:
    from archive import ArchiveError

    try:
        return archive.read_run_meta(run_id)
    except (ArchiveError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _number(value) -> float | None:
    """A figure as a float, or None when it is missing (None, NaN, pandas' NA)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _int(value) -> int | None:
    x = _number(value)
    return None if x is None else int(x)


def _champion_chain(archive, run_id: str, meta: dict) -> tuple[str | None, list[dict]]:
    """The run's champion id (None: none yet) and its lineage, seed first."""
    from evolve.run import lineage_rows

    champion_id = meta.get("champion_id")
    return champion_id, (lineage_rows(archive, run_id, champion_id) if champion_id else [])


def _champion_line(archive, run_id: str, meta: dict) -> str:
    from archive import edit_label

    champion_id, chain = _champion_chain(archive, run_id, meta)
    if not champion_id:
        return "champion: none yet"
    if not chain:
        return f"champion: {champion_id}"
    row = chain[-1]
    speedup, cycles = _number(row.get("speedup_vs_reference")), _number(row.get("estimated_cycles"))
    figures = ", ".join(x for x in (f"{speedup:.3f}x the XLA reference" if speedup else "",
                                    f"{int(cycles):,} estimated cycles" if cycles else "")
                        if x)
    path = " -> ".join(["seed", *(edit_label(r) for r in chain[1:])])
    return (f"champion: {champion_id} ({figures})\n  {path}\n"
            f"  'evolve lineage {champion_id}' draws it; 'evolve promote {run_id}' writes it out")


def _params(row: dict) -> dict:
    params = row.get("params")
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            return {}
    return params if isinstance(params, dict) else {}


def lineage_json(chain: list[dict]) -> list[dict]:
    """The chain of edits, seed first: one object per individual, with its figures where known."""
    from archive import edit_label

    out, prev = [], None
    for row in chain:
        speedup = _number(row.get("speedup_vs_reference"))
        out.append({
            "individual_id": str(row["individual_id"]), "run_id": row.get("run_id"),
            "generation": int(row["generation"]),
            "parent_ids": [str(p) for p in (row.get("parent_ids") if row.get("parent_ids") is not None else [])],
            "edit": "seed" if row.get("operator") == "seed" else edit_label(row), "operator": row.get("operator"),
            "params": _params(row), "status": row.get("status"), "error": row.get("error"),
            "estimated_cycles": _int(row.get("estimated_cycles")), "latency_s": _number(row.get("latency_s")),
            "speedup_vs_reference": speedup,
            "speedup_over_parent": speedup / prev if speedup and prev else None,
            "timing_source": row.get("timing_source"), "chip": row.get("chip"),
            "libtpu_version": row.get("libtpu_version"), "task_key": row.get("task_key")})
        prev = speedup or prev
    return out


class RunCommand(Command):
    name = "run"
    help = "start an evolution run"
    parents = ("data_dir",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        p = parser
        p.add_argument("--seed", default=None,
                       help="a built-in seed (evolve seeds) or a seed directory (default flash_attention)")
        p.add_argument("--chip", default=None, help="v5e (default) or v6e")
        p.add_argument("--shape", default=None, help="e.g. B=1,H=8,N=2048,D=128")
        p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None)
        p.add_argument("--dtype", default=None, help="bfloat16 (the seeds' default), float16 or float32")
        add_chips_argument(p)
        p.add_argument("--timing", default=None, help="auto (default: measured on a TPU host, else "
                                                       "compiler_estimate), compiler_estimate or measured")
        p.add_argument("--population", type=int, default=None)
        p.add_argument("--generations", type=int, default=None)
        p.add_argument("--rng-seed", type=int, default=None)
        p.add_argument("--prune-factor", type=float, default=None,
                       help="prune (skip correctness for) children estimated slower than this times the "
                            "champion; 0: off (default 2)")
        p.add_argument("--workers", type=int, default=None, help="parallel judges (default: one per core)")
        p.add_argument("--lag", type=int, default=None,
                       help="child i is bred from the results of items up to i - lag (default: twice the "
                            "workers); 1 breeds one at a time")
        p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                       help="judge JAX's tuned kernel side by side (default on)")
        p.add_argument("--config", default=None, help="a TOML file with [search], [task], [judge] tables")
        add_executor_arguments(p)

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.cli_eval import check_tiling
        from evolve.executor import open_executor
        from evolve.run import EvolutionRun

        config = _config_from_args(args)
        check_tiling(config.task.load_seed().kernel_source, config.task.task())
        _archive(args.data_dir, create=True)
        with open_executor(config.judge) as executor:
            run = EvolutionRun(config, args.data_dir, executor=executor)
            print(f"run {run.run_id}: {config.search.population} individuals x {config.search.generations} "
                  f"generations on {run.task.key}, chip {config.judge.chip}, data in {args.data_dir}; "
                  f"judged {executor.describe()}", file=sys.stderr)
            _report(run, run.start())
        return 0


class ResumeCommand(Command):
    name = "resume"
    help = "continue a run that was interrupted"
    parents = ("data_dir",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run")
        add_executor_arguments(parser)

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.config import RunConfig
        from evolve.executor import open_executor
        from evolve.run import EvolutionRun

        archive = _archive(args.data_dir)
        meta = _meta(archive, args.run)
        config = with_executor(RunConfig.from_dict(meta["config"]), args.executor, args.ray_address)
        with open_executor(config.judge) as executor:
            run = EvolutionRun(config, args.data_dir, run_id=args.run, strategy=meta.get("strategy", "ga"),
                               executor=executor)
            print(f"resuming {args.run}; judged {executor.describe()}", file=sys.stderr)
            _report(run, run.resume())
        return 0


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

    def take_action(self, args: argparse.Namespace) -> int:
        archive = _archive(args.data_dir)
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
        meta = _meta(archive, args.run)
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

        from evolve.stages import format_breakdown

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
        print(_champion_line(archive, run_id, meta))
        print()
        workers = (meta.get("config", {}).get("judge", {}) or {}).get("workers") or None
        print(format_breakdown(df, workers=workers))
        return 0

    def run_document(self, archive, run_id: str, meta: dict, df, *, ids: bool) -> dict:
        """The run as one JSON object: its record, generations, champion and seconds per stage."""
        from evolve.stages import stage_seconds

        champion_id, chain = _champion_chain(archive, run_id, meta)
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
        doc = {"run_id": run_id, "status": meta.get("status"), "task_key": meta.get("task_key"),
               "strategy": meta.get("strategy"), "chip": meta.get("chip"),
               "timing_sources": sorted(df["timing_source"].dropna().unique()) if not df.empty else [],
               "evaluations": len(df), "generations": generations, "champion": champion,
               "peers": meta.get("peers") or {},
               "stage_seconds": stage_seconds(df) if not df.empty else {}}
        if ids:
            doc["individuals"] = [] if df.empty else self._individuals(df).to_dict("records")
        return doc


_UI_RUN_NAME = re.compile(r"^g\d{3,}-(?P<id>[0-9a-f]+)$")


def resolve_id(archive, text: str, data_dir: str) -> str:
    """An individual id from itself, a unique prefix of it, or the UI's run name ``g004-<id>``."""
    text = text.strip()
    match = _UI_RUN_NAME.match(text)
    wanted = match.group("id") if match else text
    df = archive.evaluations()
    ids = set(df["individual_id"].astype(str)) if not df.empty else set()
    if wanted in ids:
        return wanted
    hits = sorted(i for i in ids if i.startswith(wanted)) if wanted else []
    if len(hits) == 1:
        return hits[0]
    hint = "'evolve status RUN --ids' lists a run's individuals"
    if hits:
        raise UsageError(f"{text!r} is the start of {len(hits)} individual ids ({', '.join(hits[:3])}, ...); "
                         f"give more of it ({hint})")
    raise UsageError(f"no individual {text!r} in {data_dir}; {hint}")


class LineageCommand(Command):
    name = "lineage"
    help = "the chain of edits from the seed to an individual"
    description = ("The chain of edits from the seed to an individual, each with its speedup, and a picture. "
                   "--format json: one JSON object with the chain (and no picture unless --out is given).")
    parents = ("data_dir", "format")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("id", help="an individual id, a unique prefix of one, or the UI's run name (g004-<id>)")
        parser.add_argument("--out", default=None,
                            help="where to write the SVG picture (default lineage-ID.svg, or tree-RUN.svg with "
                                 "--tree; with --format json only when given)")
        parser.add_argument("--tree", action="store_true",
                            help="draw the individual's whole run as a family tree, its path from the seed in red")
        parser.add_argument("--run", default=None,
                            help="the run to read the lineage in, when the same kernel stands in several "
                                 "(default: the latest run that evaluated it)")

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.run import lineage_rows

        archive = _archive(args.data_dir)
        args.id = resolve_id(archive, args.id, args.data_dir)
        if args.run is not None:
            _meta(archive, args.run)
        chain = lineage_rows(archive, args.run, args.id)
        if not chain:
            raise UsageError(f"individual {args.id} is not in run {args.run}; "
                             f"'evolve status {args.run} --ids' lists its individuals")
        run_id = str(chain[-1]["run_id"])
        if args.format == "json":
            picture = self.draw(archive, args, chain, run_id) if args.out else None
            print_json({"individual_id": args.id, "run_id": run_id, "task_key": chain[-1].get("task_key"),
                        "chain": lineage_json(chain), "picture": str(picture) if picture else None,
                        "picture_kind": ("family_tree" if args.tree else "lineage") if picture else None})
            return 0
        prev = None
        for step in lineage_json(chain):
            sp = step["speedup_vs_reference"]
            gain = f"  ({sp / prev:.2f}x over its parent)" if sp and prev else ""
            sp_text = f"{sp:.3f}x vs reference" if sp else step["status"]
            print(f"{step['individual_id']}  g{step['generation']}  {step['edit']:<60} {sp_text}{gain}")
            prev = sp or prev
        out = self.draw(archive, args, chain, run_id)
        print(f"family tree of run {run_id}: {out}" if args.tree else f"picture: {out}")
        return 0

    @staticmethod
    def draw(archive, args: argparse.Namespace, chain: list[dict], run_id: str) -> Path:
        from mlflow_runs import family_tree_svg, lineage_svg

        if args.tree:
            from evolve.run import tree_caption

            out = Path(args.out or f"tree-{run_id}.svg")
            svg = family_tree_svg(archive.evaluations(run_id).to_dict("records"),
                                  [r["individual_id"] for r in chain], tree_caption(run_id, chain[-1]))
        else:
            out = Path(args.out or f"lineage-{args.id}.svg")
            svg = lineage_svg(chain, title=f"lineage of {args.id}")
        try:
            out.write_text(svg)
        except OSError as exc:
            raise UsageError(f"cannot write {out} ({exc.strerror or exc}); give another --out") from None
        return out


class SyncCommand(Command):
    name = "sync"
    help = "rebuild a run's MLflow side from the archive"
    parents = ("data_dir",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run")

    def take_action(self, args: argparse.Namespace) -> int:
        from mlflow_runs import Tracker, ensure_store

        archive = _archive(args.data_dir)
        _meta(archive, args.run)
        ensure_store(args.data_dir)
        counts = Tracker(args.data_dir).sync(args.run, archive)
        print(f"synced run {args.run}: {counts}")
        return 0


class UiCommand(Command):
    name = "ui"
    help = "the MLflow UI on this data directory, on 127.0.0.1"
    parents = ("data_dir",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, default=5000)
        parser.add_argument("--jobs", action="store_true", help="also start MLflow's job consumers (off by default)")

    def take_action(self, args: argparse.Namespace) -> int:
        from mlflow_runs import ensure_store

        if not 1 <= args.port <= 65535:
            raise UsageError(f"--port must be between 1 and 65535, got {args.port}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", args.port))
            except OSError as exc:
                raise UsageError(f"port {args.port} on 127.0.0.1 is not free ({exc.strerror}); "
                                 "pick another with --port") from None
        _archive(args.data_dir)
        uri = ensure_store(args.data_dir)
        # One person browsing: one web worker, and MLflow's job consumers only when asked for.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "true" if args.jobs else "false"}
        print(f"MLflow UI on http://127.0.0.1:{args.port} (store {uri}); Ctrl-C to stop", file=sys.stderr)
        return subprocess.call([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                                "--host", "127.0.0.1", "--port", str(args.port), "--workers", "1"], env=env)


class PromoteCommand(Command):
    name = "promote"
    help = "re-verify a run's champion, write it out, register it"
    parents = ("data_dir",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run")
        parser.add_argument("--to", default=None, help="where to write the kernel (default champion-RUN.py)")
        parser.add_argument("--name", default=None, help="registered model name")

    def take_action(self, args: argparse.Namespace) -> int:
        from archive import edit_label
        from evaluator.judge import Judge, JudgeConfig
        from evolve.config import RunConfig
        from evolve.run import lineage_rows
        from mlflow_runs import (call_spec, champion_header, ensure_store, example_inputs, individual_run,
                                 register_champion, run_link, with_docstring)
        from mutations import read_tunables

        archive = _archive(args.data_dir)
        meta = _meta(archive, args.run)
        champion_id = meta.get("champion_id")
        if not champion_id:
            raise UsageError(f"run {args.run} has no champion yet; let it finish or 'evolve resume {args.run}'")
        config = RunConfig.from_dict(meta["config"])
        task = config.task.task()
        chain = lineage_rows(archive, args.run, champion_id)
        source = chain[-1]["source"]
        judge = Judge(JudgeConfig(chip=config.judge.chip, timing=config.judge.timing,
                                  cache_dir=str(Path(args.data_dir) / "cache")))
        result = judge.evaluate(source, task)        # re-verified, never taken on trust
        if not result.ok:
            print(f"evolve: champion {champion_id} no longer passes the judge: {result.status.value}: "
                  f"{result.error}", file=sys.stderr)
            return 1
        name = args.name or f"{task.name}_{config.judge.chip}"
        found = individual_run(args.data_dir, args.run, champion_id)
        link = f"http://127.0.0.1:5000/#/experiments/{found[0]}/runs/{found[1]}" if found else None
        tunables = read_tunables(source)
        header = champion_header(name=name, run_id=args.run, individual_id=champion_id,
                                 lineage=[edit_label(r) for r in chain[1:]], task=task, result=result,
                                 tunables=tunables, run_link=link + " (with 'evolve ui')" if link else None)
        promoted = with_docstring(source, header)
        out = Path(args.to or f"champion-{args.run}.py")
        out.write_text(promoted)
        ensure_store(args.data_dir)
        m, p = result.metrics, result.provenance
        provenance = {"run_id": args.run, "individual_id": champion_id, "task_key": task.key,
                      "individual_mlflow_run": found[1] if found else None, "status": result.status.value,
                      "timing_source": p.timing_source, "chip": p.chip, "libtpu_version": p.libtpu_version,
                      "jax_version": p.jax_version, "latency_s": m.latency_s, "estimated_cycles": m.estimated_cycles,
                      "speedup_vs_reference": m.speedup_vs_reference, "max_abs_error": m.max_abs_error}
        description = "```\n" + header + "\n```" + (
            f"\n\nThe individual's run, with its lineage: {run_link(found[0], found[1], champion_id)}"
            if found else "")
        version = register_champion(promoted, name, provenance, call=call_spec(task), description=description,
                                    example=example_inputs(task, tunables), data_dir=args.data_dir)
        print(f"promoted {champion_id} to {out}; registered as models:/{name}@champion "
              f"(version {getattr(version, 'version', version)}); the file's docstring says how to call it")
        return 0


COMMANDS = (RunCommand, ResumeCommand, StatusCommand, LineageCommand, SyncCommand, UiCommand, PromoteCommand)


def add_commands(subparsers, parents=None) -> None:
    _add_commands(subparsers, COMMANDS, parents)
