"""One evolution run: the search wired to the judge, the Parquet archive and MLflow.

The archive is the source of truth. Every evaluation is appended (one batch file, atomically)
the moment it finishes, so ``kill -9`` loses nothing; MLflow is best-effort and is rebuilt
from the archive by ``evolve sync``. Before judging a source, the archive is asked whether it
was judged already for this task, chip, timing source and libtpu version.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

from archive import Archive, edit_label, make_row
from evaluator import Judge
from evaluator import EvalResult, Status
from evaluator.versions import versions
from evolve.config import RunConfig
from evolve.search.individual import Individual
from evolve.executors.base import Executor, open_executor
from evolve.search.loop import Search
from evolve.start.resolve import resolve_start
from evolve.search.strategies import strategy_class
from mlflow_runs import Tracker, ensure_store
from mutations import read_tunables


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


class Progress:
    """One status line: generation, evaluations, best speedup so far, time left."""

    def __init__(self, total_evals: int, stream=sys.stderr) -> None:
        self.total, self.done, self.judged, self.best = total_evals, 0, 0, None
        self.start = time.monotonic()
        self.stream, self.tty = stream, stream.isatty()
        self.generation = 0
        self.lock = threading.Lock()

    def update(self, *, judged: bool, result=None) -> None:
        """One more evaluation; ``result`` its verdict (the best by ``EvalResult.merit`` is shown)."""
        with self.lock:
            self.done += 1
            self.judged += int(judged)
            if result is not None and result.merit > 0 and (self.best is None or result.merit > self.best.merit):
                self.best = result
            self.show()

    def show(self, final: bool = False) -> None:
        elapsed = time.monotonic() - self.start
        rate = elapsed / self.done if self.done else None
        left = max(self.total - self.done, 0)
        eta = f"~{rate * left / 60:.1f} min left" if rate and not final else f"{elapsed / 60:.1f} min"
        m = self.best.metrics if self.best is not None else None
        best = ("best speedup -" if m is None else f"best speedup {m.speedup_vs_reference:.3f}x"
                if m.speedup_vs_reference else f"best {m.estimated_cycles or 0:,} cycles" if m.estimated_cycles
                else f"best {m.latency_s * 1e6:.1f} us")
        line = (f"gen {self.generation} | evaluations {self.done}/{self.total} "
                f"({self.judged} judged, {self.done - self.judged} from archive) | {best} | {eta}")
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + line + end, file=self.stream, end="", flush=True)


class EvolutionRun:
    def __init__(self, config: RunConfig, data_dir: str, run_id: str | None = None,
                 strategy: str = "ga", executor: Executor | None = None) -> None:
        """``executor``: where candidates are judged (the caller's, left open); None: the one the
        configuration names, opened for the search and shut down after it."""
        self.executor = executor
        workers = config.judge.workers or (executor.workers if executor else os.cpu_count() or 1)
        # Fixed now and stored with the run: a resume elsewhere replays the same run.
        config = dataclasses.replace(
            config, judge=dataclasses.replace(config.judge, workers=workers),
            search=dataclasses.replace(config.search, lag=config.search.lag or 2 * workers))
        self.config = config
        self.strategy = strategy
        self.search: Search | None = None
        self.data_dir = Path(data_dir)
        self.archive = Archive(self.data_dir)
        self.run_id = run_id or new_run_id()
        self.seed = config.task.load_seed()
        self.task = config.task.task()
        # the seed's kernel, or --start's (a block parameter it leaves to its caller given a default)
        self.start_from = resolve_start(config.task.start, self.seed).for_task(self.task)
        self.seed_source = self.start_from.source
        self.judge = Judge(self.config.judge.judge_config(self.data_dir))
        ensure_store(self.data_dir)           # the schema, once, before any worker starts
        self.tracker = Tracker(self.data_dir)
        self.prov = self.judge.provenance(self.task)
        self.sources: dict[str, str] = {}
        self.in_run: set[str] = set()        # individuals that have a row in this run
        self.peers: dict[str, EvalResult] = {}
        self._peer_thread: threading.Thread | None = None
        self._judging = None                 # (source, cut) -> EvalResult: the executor's, for the search
        self.progress = Progress(config.search.total())
        self.no_pass: NoPass | None = None   # why the run has no champion, once it has finished without one

    # ---- evaluation: archive first, then the judge, row appended the moment it is judged -------
    # Every call runs in this process (on the executor's threads): the archive has one writer. Only
    # the judging itself may run elsewhere (executor.judging).
    def _cached(self, ind: Individual) -> EvalResult | None:
        hit = self.archive.lookup(ind.id, self.task.key, self.prov.chip, self.prov.timing_source,
                                  self.prov.libtpu_version)
        return EvalResult.from_dict(hit) if hit else None

    def _row(self, ind: Individual, result: EvalResult, from_archive: bool = False) -> dict[str, Any]:
        try:
            tunables = read_tunables(ind.source)
        except Exception:  # noqa: BLE001 - tunables are informative only
            tunables = {}
        return make_row(run_id=self.run_id, source=ind.source, result=result, task_key=self.task.key,
                        generation=ind.generation, parent_ids=list(ind.parent_ids), operator=ind.operator,
                        params=ind.params, edits=ind.edits, tunables=tunables, from_archive=from_archive,
                        start=self.start_from.label)

    def _evaluate_one(self, ind: Individual) -> tuple[EvalResult, bool, dict]:
        """Runs on an executor's worker: the archive's verdict, else the sandboxed judge's."""
        cut = ind.cut
        self.progress.generation = max(self.progress.generation, ind.generation)
        cached = self._cached(ind)
        if cached is not None and cached.status is Status.PRUNED and (
                cut is None or (cached.metrics.estimated_cycles or 0) <= cut):
            cached = None     # pruned under a tighter cut than this child's: judge it in full now
        if cached is not None:
            result, judged = cached, False
        else:
            result, judged = self._judging(ind.source, cut), True
        row = self._row(ind, result, from_archive=not judged)
        fresh = ind.id not in self.in_run     # judged now, or judged by another run: record it here
        if fresh:
            self.in_run.add(ind.id)
            self.archive.append([row])
        self.progress.update(judged=judged, result=result)
        return result, fresh, row

    def record(self, ind: Individual, outcome: tuple[EvalResult, bool, dict]) -> None:
        result, fresh, row = outcome
        ind.result = result
        ind.fitness.values = (ind.merit,)
        self.sources[ind.id] = ind.source
        if fresh:
            parent = self.sources.get(ind.parent_ids[0]) if ind.parent_ids else None
            self.tracker.log_individual(row, parent)

    def _search(self) -> Search:
        kind = strategy_class(self.strategy)
        self.search = kind(self.config, self.seed_source, self.task, evaluate=self._evaluate_one,
                           record=self.record, on_generation=self.on_generation)
        return self.search

    def on_generation(self, generation: int, pool: list[Individual], search: Search) -> None:
        """The generation's logbook record (evolve/search/loop.py), stored with the search state and
        logged on the evolution run: one source for both, and for ``evolve sync``."""
        stats = dict(search.logbook[-1])
        self.archive.append_generation(self.run_id, generation, [i.id for i in pool],
                                       [i.id for i in search.hof], stats)
        self.tracker.log_generation_stats(generation, stats)

    # ---- run and resume -----------------------------------------------------------------------
    def _meta(self, status: str) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "task_key": self.task.key, "status": status,
                "data_dir": str(self.data_dir), "timing_source": self.prov.timing_source,
                "chip": self.prov.chip, "strategy": self.strategy, "start": self.start_from.record(), **versions()}

    def _judge_peers(self) -> None:
        # The strongest alternatives a user has (the seed names them), judged by the same judge.
        for name, path in self.seed.peer_paths().items():
            self.peers[name] = self._judging(path.read_text())

    def start_peers(self) -> None:
        """Judge the peers in the background while the search runs (they are not individuals:
        never selected, never in the lineage; their figures go in the run's record)."""
        if self.config.judge.peers and self._peer_thread is None:
            self._peer_thread = threading.Thread(target=self._judge_peers, daemon=True)
            self._peer_thread.start()

    def _search_all(self) -> Individual | None:
        if self.executor is not None:
            return self._search_on(self.executor)
        with open_executor(self.config.judge) as executor:
            return self._search_on(executor)

    def _search_on(self, executor: Executor) -> Individual | None:
        self._judging = executor.judging(self.judge, self.task)   # times the reference here, once
        self.start_peers()
        search = self._search()
        champion = search.run(executor)
        return self._finish(search, champion)

    def start(self) -> Individual | None:
        self.archive.write_run_meta(self.run_id, self._meta("running"))
        self.tracker.start_run(self.run_id, self.task.key, self.config.to_dict(), start=self.start_from.record())
        return self._search_all()

    def resume(self) -> Individual | None:
        """Replay the run from its start: every verdict it already has comes back from the
        archive (nothing is judged twice), so the replay reaches the state the run had, and goes
        on from there with the same choices the uninterrupted run would have made."""
        self.tracker.start_run(self.run_id, self.task.key, self.config.to_dict(), start=self.start_from.record())
        rows = self.archive.evaluations(self.run_id)
        if not rows.empty:
            self.in_run.update(rows["individual_id"])
            self.sources.update(zip(rows["individual_id"], rows["source"]))
        return self._search_all()

    def _finish(self, search: Search, champion: Individual | None) -> Individual | None:
        if self._peer_thread is not None:
            self._peer_thread.join()
        self.progress.show(final=True)
        meta = self._meta("finished")
        meta["peers"] = {name: {"status": r.status.value, "estimated_cycles": r.metrics.estimated_cycles,
                                "latency_s": r.metrics.latency_s,
                                "speedup_vs_reference": r.metrics.speedup_vs_reference, "error": r.error}
                         for name, r in self.peers.items()}
        if champion is not None:
            meta["champion_id"] = champion.id
            chain = lineage_rows(self.archive, self.run_id, champion.id)
            self.tracker.log_lineage_picture(chain)
            self.tracker.log_champion(chain, ["seed", *(edit_label(r) for r in chain[1:])])
            self.tracker.log_family_tree(self.archive.evaluations(self.run_id).to_dict("records"),
                                         [r["individual_id"] for r in chain], tree_caption(self.run_id, chain[-1]))
        else:
            from evolve.cli.common import evolve_command

            judged = [ind for ind in search.taken if ind.result is not None]
            start = self.start_from  # a module or a graft as given, else the file it was read from
            command = eval_command(self.config, start.spec if start.kind == "module" or start.grafted else start.path,
                                   evolve_command())
            self.no_pass = NoPass.of(judged, search.stopped, command)
            meta["no_pass"] = self.no_pass.to_dict()
            if self.tracker.parent_run_id is not None:       # the report on the evolution run, in the UI
                self.tracker.safe.call(self.tracker.client.set_tag, self.tracker.parent_run_id,
                                       "mlflow.note.content", "\n".join(self.no_pass.lines()))
        self.archive.write_run_meta(self.run_id, meta)
        self.tracker.finish("FINISHED" if champion is not None else "FAILED")
        return champion


# What to try when every kernel failed in one way, by the judge's status.
NEXT_STEPS = {
    "FAIL_VMEM": "the kernel's blocks do not fit in VMEM at this shape: start from smaller blocks (its block "
                 "sizes), or give a smaller --shape",
    "OOM": "a judged child ran out of host memory: raise --memory GIB, or give a smaller --shape",
    "CRASH": "a judged child died (most often out of memory while compiling): give a smaller --shape, or raise "
             "--memory GIB",
    "TIMEOUT": "a stage ran past its time budget: give a smaller --shape",
    "FAIL_CORRECTNESS": "the kernel's numbers are not the task's: check what it computes against the task",
    "FAIL_TIMING": "no timing source could time it: try another --timing",
    "SUSPECT": "faster than the roofline allows: the kernel may skip work the task needs",
}


@dataclasses.dataclass(frozen=True)
class NoPass:
    """Why a run has no champion: no kernel it judged passed. ``counts``: status -> kernels (first
    met first); ``errors``: status -> the first error of that status, one line; ``stopped``: the
    generation the run stopped in with nothing to breed from (None: it spent its budget);
    ``eval``: the command that judges the start alone and prints its verdict in full."""
    status: str
    judged: int
    counts: dict[str, int]
    errors: dict[str, str]
    stopped: int | None
    eval: str

    @classmethod
    def of(cls, judged: list[Individual], stopped: int | None, eval_command: str) -> NoPass:
        counts: dict[str, int] = {}
        errors: dict[str, str] = {}
        for ind in judged:
            status = ind.result.status.value
            counts[status] = counts.get(status, 0) + 1
            first = next((line.strip() for line in (ind.result.error or "").splitlines() if line.strip()), "")
            errors.setdefault(status, first[:200] or "(no message)")
        return cls("NO_PASS", len(judged), counts, errors, stopped, eval_command)

    def lines(self) -> list[str]:
        where = (f"the run stopped in generation {self.stopped}: nothing passed, so there is nothing to breed from"
                 if self.stopped is not None else "the run spent its budget")
        out = [f"no kernel passed the judge: {self.judged} judged, every one failed; {where}"]
        width = max((len(s) for s in self.counts), default=0)
        out += [f"  {status:<{width}} {n:>4}  first: {self.errors[status]}" for status, n in self.counts.items()]
        out.append("next:")
        out += [f"  - {status}: {NEXT_STEPS[status]}" for status in self.counts if status in NEXT_STEPS]
        out.append(f"  - the start's verdict in full (its error and log): {self.eval}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "report": "\n".join(self.lines())}


def eval_command(config: RunConfig, start: str | None = None, evolve: str = "evolve") -> str:
    """The ``evolve eval`` command that judges a run's start (``start``: as ``--start`` takes it;
    None: the configuration's) on the run's task and judge."""
    import shlex

    t, j = config.task, config.judge
    flags = [("--start", start or t.start), ("--reference", t.reference), ("--entry", t.entry),
             ("--seed", None if t.reference else t.seed), ("--shape", t.shape), ("--dtype", t.dtype),
             ("--chips", t.chips), ("--chip", j.chip), ("--timing", None if j.timing == "auto" else j.timing),
             ("--memory", j.memory_gib)]
    words = [evolve, "eval"] + [w for flag, value in flags if value
                                for w in (flag, shlex.quote(str(value)))]
    return " ".join(words + ({True: ["--causal"], False: ["--no-causal"]}.get(t.causal, [])))


def tree_caption(run_id: str, row: dict[str, Any]) -> str:
    return (f"run {run_id} · {row.get('task_key')} · {row.get('timing_source')}, chip {row.get('chip')}, "
            f"libtpu {row.get('libtpu_version')}")


def lineage_rows(archive: Archive, run_id: str | None, individual_id: str) -> list[dict[str, Any]]:
    """Seed -> individual, following first parents, as archive rows (one per individual)."""
    return archive.lineage(individual_id, run_id=run_id)
