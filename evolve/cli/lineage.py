"""`evolve lineage | sync | ui | promote`: browse a run's family tree, in the terminal or MLflow's
UI, and promote its champion (re-judged, registered in MLflow).

Every one of them works on the data directory (--data-dir, shared: evolve.cli.common)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from evolve.cli.common import Command, add_json_alias, print_json
from evolve.cli.store import archive_at, lineage_json, resolve_id, run_meta, start_label
from evolve.errors import UsageError


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
        add_json_alias(parser, help="print one JSON object instead of the chain and a picture (the same as "
                                    "--format json)")

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.run import lineage_rows

        archive = archive_at(args.data_dir)
        args.id = resolve_id(archive, args.id, args.data_dir)
        if args.run is not None:
            run_meta(archive, args.run)
        chain = lineage_rows(archive, args.run, args.id)
        if not chain:
            raise UsageError(f"individual {args.id} is not in run {args.run}; "
                             f"'evolve status {args.run} --ids' lists its individuals")
        run_id = str(chain[-1]["run_id"])
        if args.format == "json":
            picture = self.draw(archive, args, chain, run_id) if args.out else None
            print_json({"individual_id": args.id, "run_id": run_id, "task_key": chain[-1].get("task_key"),
                        "start": start_label(chain[0]), "chain": lineage_json(chain),
                        "picture": str(picture) if picture else None,
                        "picture_kind": ("family_tree" if args.tree else "lineage") if picture else None})
            return 0
        if start_label(chain[0]):
            print(f"start (the 'seed' below): {start_label(chain[0])}")
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

        archive = archive_at(args.data_dir)
        run_meta(archive, args.run)
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
        archive_at(args.data_dir)
        uri = ensure_store(args.data_dir)
        # One person browsing: one web worker, and MLflow's job consumers only when asked for.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "true" if args.jobs else "false"}
        print(f"MLflow UI on http://127.0.0.1:{args.port} (store {uri}); Ctrl-C to stop", file=sys.stderr)
        # A session of its own: the server's workers are one process group, stopped together.
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                                   "--host", "127.0.0.1", "--port", str(args.port), "--workers", "1"],
                                  env=env, start_new_session=True)
        try:
            return server.wait()
        except KeyboardInterrupt:        # Ctrl-C or SIGTERM (evolve.cli's handler): the way to stop it
            for sig in (signal.SIGINT, signal.SIGTERM):    # a second one does not cut the stop short
                signal.signal(sig, signal.SIG_IGN)
            stop_group(server)
            print(f"evolve: the MLflow UI on port {args.port} stopped", file=sys.stderr)
            return 0
        finally:
            stop_group(server)


def stop_group(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop ``process`` and its process group: SIGTERM, then SIGKILL after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        try:                        # the leader is gone; its workers may linger a moment
            os.killpg(process.pid, 0)
        except (ProcessLookupError, PermissionError):
            return


class PromoteCommand(Command):
    name = "promote"
    help = "re-verify a run's champion, write it out, register it"
    parents = ("data_dir",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run")
        parser.add_argument("--to", default=None, help="where to write the kernel (default champion-RUN.py)")
        parser.add_argument("--name", default=None, help="registered model name")

    def take_action(self, args: argparse.Namespace) -> int:
        from evolve.promote import promote_champion

        archive = archive_at(args.data_dir)
        done = promote_champion(archive, args.data_dir, args.run, run_meta(archive, args.run),
                                to=args.to, name=args.name)
        if not done.ok:
            print(f"evolve: champion {done.champion_id} no longer passes the judge: {done.error}", file=sys.stderr)
            return 1
        print(f"promoted {done.champion_id} to {done.path}; registered as models:/{done.name}@champion "
              f"(version {getattr(done.version, 'version', done.version)}); the file's docstring says how to call it")
        return 0


COMMANDS = (LineageCommand, SyncCommand, UiCommand, PromoteCommand)
