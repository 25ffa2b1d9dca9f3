"""Lineage in MLflow: a parent run per evolution run, a nested child run per evaluated individual.

Best-effort throughout: every MLflow call goes through :class:`BestEffort`, so a locked,
unreachable or broken store costs a warning, never the run. The Parquet archive is the record;
:meth:`Tracker.sync` rebuilds the MLflow side from it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from evaluator import METRIC_COLUMNS

from ._best_effort import BestEffort
from ._lineage_svg import lineage_svg
from ._notes import DIFF_ARTIFACT, NOTE_TAG, champion_note, individual_note, run_name
from ._store import DEFAULT_DATA_DIR, ensure_store, get_or_create_experiment
from ._values import clean as _clean

RUN_TAG = "pallas_evolve.run_id"
KIND_TAG = "pallas_evolve.kind"
ROW_TAG = "pallas_evolve.row_key"
PARENT_TAG = "mlflow.parentRunId"
_MAX_PARAM = 500
# The search's per-generation statistics (its DEAP logbook record, evolve/search/loop.py; stored in
# the archive's generation records) -> the evolution run's metric names.
GENERATION_METRICS = {"best": "best_speedup", "median": "median_speedup", "pass_rate": "fraction_valid",
                      "evals": "evaluations"}
# Logged as metrics, rounded to 5 significant digits (the archive keeps the exact values): every
# numeric metric of the archive (derived from evaluator.result.Metrics) and the wall time. Not
# logged: max_rel_error (relative error near zero outputs says nothing; the judge compares absolute
# error with the XLA program's own), copy_trap (a named warning in the description instead) and
# regime (not a number).
_NOT_LOGGED = frozenset({"max_rel_error"})
_METRIC_FIELDS = (*(name for name, kind in METRIC_COLUMNS.items() if kind in (int, float) and name not in _NOT_LOGGED),
                  "wall_time_s")


def _round(value: float) -> float:
    return float(f"{value:.5g}")


def _json_obj(value: Any, default: Any) -> Any:
    value = _clean(value)
    if value is None:
        return default
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return default
    return value


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> dict[str, str]:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = str(value)[:_MAX_PARAM]
    return out


def _millis(value: Any) -> int:
    value = _clean(value)
    if value is None:
        return int(time.time() * 1000)
    if isinstance(value, str):
        import datetime as dt
        value = dt.datetime.fromisoformat(value)
    return int(value.timestamp() * 1000)


def row_key(row: dict[str, Any]) -> str:
    """A stable key of one archived evaluation (used to skip rows already logged)."""
    import pandas as pd

    at = _clean(row.get("evaluated_at"))
    text = "|".join(str(x) for x in (row.get("individual_id"), pd.Timestamp(at).isoformat() if at else "",
                                       _clean(row.get("chip")), _clean(row.get("timing_source"))))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _quote(value: str) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def individual_run(data_dir: str | os.PathLike, run_id: str, individual_id: str) -> tuple[str, str] | None:
    """(experiment id, MLflow run id) of an individual's run in ``run_id``, or None (best-effort)."""
    safe = BestEffort(max_failures=1)
    uri = safe.call(ensure_store, Path(data_dir))
    if not uri:
        return None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = safe.call(client.search_experiments) or []
    found = safe.call(client.search_runs, [e.experiment_id for e in experiments],
                      filter_string=f"tags.individual_id = {_quote(individual_id)} and "
                                    f"tags.`{RUN_TAG}` = {_quote(run_id)}", max_results=1) if experiments else None
    return (found[0].info.experiment_id, found[0].info.run_id) if found else None


class Tracker:
    """Log an evolution run's lineage into the MLflow store of ``data_dir`` (or ``tracking_uri``)."""

    def __init__(self, data_dir: str | os.PathLike = DEFAULT_DATA_DIR, *, tracking_uri: str | None = None,
                 max_failures: int = 3):
        self.data_dir = Path(data_dir)
        self.safe = BestEffort(max_failures=max_failures)
        self.tracking_uri = tracking_uri or self.safe.call(ensure_store, self.data_dir)
        self.client = None
        if self.tracking_uri:
            from mlflow.tracking import MlflowClient

            self.client = self.safe.call(MlflowClient, tracking_uri=self.tracking_uri,
                                         registry_uri=self.tracking_uri)
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self._child_runs: dict[str, str] = {}   # individual_id -> MLflow run id

    @property
    def ok(self) -> bool:
        """Whether tracking is still on (no permanent failure)."""
        return self.client is not None and not self.safe.disabled

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.client is None:
            return None
        return self.safe.call(getattr(self.client, method), *args, **kwargs)

    # ---- the evolution run -----------------------------------------------------------------
    def start_run(self, run_id: str, task_key: str, config: dict[str, Any],
                  start: dict[str, Any] | None = None) -> None:
        """Open (or, on resume, reopen) the parent run of ``run_id`` in the experiment ``task_key``;
        its params: the run's configuration and ``start`` (where its first kernel came from:
        ``start.name``, ``start.version``, ...)."""
        self.run_id = run_id
        if self.client is None:
            return
        self.experiment_id = self.safe.call(get_or_create_experiment, self.client, task_key, self.data_dir)
        if self.experiment_id is None:
            return
        found = self._call("search_runs", [self.experiment_id],
                           filter_string=f"tags.`{RUN_TAG}` = {_quote(run_id)} and tags.`{KIND_TAG}` = 'run'",
                           max_results=1)
        if found:
            self.parent_run_id = found[0].info.run_id
            self._call("update_run", self.parent_run_id, status="RUNNING")
            return
        run = self._call("create_run", self.experiment_id, run_name=run_id,
                         tags={RUN_TAG: run_id, KIND_TAG: "run", "task_key": task_key})
        if run is None:
            return
        self.parent_run_id = run.info.run_id
        from mlflow.entities import Param

        values = _flatten("", config or {}, {})
        _flatten("start", {k: v for k, v in (start or {}).items() if v not in (None, "")}, values)
        params = [Param(k, v) for k, v in sorted(values.items())]
        for start in range(0, len(params), 100):
            self._call("log_batch", self.parent_run_id, params=params[start:start + 100])

    def log_generation(self, generation: int, best_speedup: float | None, median_speedup: float | None,
                       fraction_valid: float | None, evaluations: int | None) -> None:
        """Per-generation fitness metrics on the parent run, ``step=generation``."""
        if self.parent_run_id is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = {"best_speedup": best_speedup, "median_speedup": median_speedup,
                  "fraction_valid": fraction_valid, "evaluations": evaluations}
        metrics = [Metric(k, _round(float(v)), now, int(generation)) for k, v in values.items()
                   if _clean(v) is not None]
        if metrics:
            self._call("log_batch", self.parent_run_id, metrics=metrics)

    def log_generation_stats(self, generation: int, stats: dict[str, Any]) -> None:
        """A generation's logbook record (keys of GENERATION_METRICS) as its metrics."""
        self.log_generation(generation, *(stats.get(key) for key in GENERATION_METRICS))

    def _parent_run_ids(self, parent_ids: list[str]) -> list[str]:
        out = []
        for pid in parent_ids:
            if pid not in self._child_runs and self.experiment_id is not None:
                found = self._call("search_runs", [self.experiment_id],
                                   filter_string=f"tags.individual_id = {_quote(pid)}",
                                   order_by=["attributes.start_time ASC"], max_results=20)
                if found:
                    same_run = [r for r in found if r.data.tags.get(RUN_TAG) == self.run_id]
                    self._child_runs[pid] = (same_run or found)[0].info.run_id
            if pid in self._child_runs:
                out.append(self._child_runs[pid])
        return out

    def log_individual(self, row: dict[str, Any], parent_source: str | None,
                       label: str | None = None) -> str | None:
        """A nested child run for one archived evaluation; returns its MLflow run id (or None)."""
        if self.parent_run_id is None:
            return None
        from mlflow.entities import Metric, Param

        ind = str(row["individual_id"])
        generation = int(_clean(row.get("generation")) or 0)
        parent_ids = [str(p) for p in (_clean(row.get("parent_ids")) or [])]
        tags = {PARENT_TAG: self.parent_run_id, RUN_TAG: self.run_id or str(row.get("run_id")),
                KIND_TAG: "individual", ROW_TAG: row_key(row), "individual_id": ind,
                "parent_ids": ",".join(parent_ids),
                "parent_run_ids": ",".join(self._parent_run_ids(parent_ids)),
                "generation": str(generation)}
        for key in ("status", "timing_source", "chip", "libtpu_version", "operator", "task_key", "stage", "start"):
            value = _clean(row.get(key))
            if value not in (None, ""):
                tags[key] = str(value)[:_MAX_PARAM]
        end = _millis(row.get("evaluated_at"))
        took = _clean(row.get("wall_time_s"))
        start = end - int(1000 * took) if isinstance(took, float | int) and math.isfinite(took) else end
        run = self._call("create_run", self.experiment_id, start_time=start, run_name=run_name(row), tags=tags)
        if run is None:
            return None
        child = run.info.run_id
        self._child_runs.setdefault(ind, child)
        params = {"operator": str(_clean(row.get("operator")) or "")}
        _flatten("tunables", _json_obj(row.get("tunables"), {}), params)
        edit_params = _json_obj(row.get("params"), {})
        _flatten("edit", edit_params if isinstance(edit_params, dict) else {"value": edit_params}, params)
        stamp = end
        metrics = []
        for name in _METRIC_FIELDS:
            value = _clean(row.get(name))
            if isinstance(value, bool | int | float) and math.isfinite(float(value)):
                metrics.append(Metric(name, _round(float(value)), stamp, generation))
        self._call("log_batch", child, metrics=metrics,
                   params=[Param(k, v) for k, v in sorted(params.items())][:100])
        source = str(_clean(row.get("source")) or "")
        self._call("log_text", child, source, "kernel.py")
        if parent_source is not None:
            diff = difflib.unified_diff(parent_source.splitlines(keepends=True),
                                        source.splitlines(keepends=True), "parent/kernel.py", "kernel.py")
            self._call("log_text", child, "".join(diff), DIFF_ARTIFACT)
        if label is None:
            from archive import edit_label

            label = "seed" if not parent_ids else edit_label(row)
        note = individual_note(row, label,
                               experiment_id=str(self.experiment_id), own_run_id=child,
                               evolution_run_id=self.parent_run_id, evolution_run_name=str(self.run_id),
                               parents=[(p, self._child_runs.get(p)) for p in parent_ids],
                               has_diff=parent_source is not None)
        self._call("set_tag", child, NOTE_TAG, note)
        # A candidate that did not pass is a failed run in the UI, not a green "Finished".
        passed = _clean(row.get("status")) == "PASS"
        self._call("set_terminated", child, "FINISHED" if passed else "FAILED", end_time=stamp)
        return child

    def log_lineage_picture(self, chain: list[dict[str, Any]], path: str | os.PathLike | None = None) -> str:
        """Draw ``chain`` (rows seed -> champion) as SVG; log it on the parent run, write it to ``path``."""
        title = f"lineage of {chain[-1].get('individual_id')}" if chain else "lineage"
        svg = lineage_svg(chain, title=title)
        if path is not None:
            Path(path).write_text(svg, encoding="utf-8")
        if self.parent_run_id is not None:
            self._call("log_text", self.parent_run_id, svg, "lineage.svg")
        return svg

    def log_family_tree(self, rows: list[dict[str, Any]], highlight: list[str], caption: str) -> str | None:
        """The whole run as a tree (see _tree.py), logged on the evolution run as family_tree.svg."""
        from ._tree import family_tree_svg

        svg = self.safe.call(family_tree_svg, rows, highlight, caption)
        if svg is not None and self.parent_run_id is not None:
            self._call("log_text", self.parent_run_id, svg, "family_tree.svg")
        return svg

    def log_champion(self, chain: list[dict[str, Any]], labels: list[str]) -> None:
        """Name the champion on the evolution run: tags, and a description whose every hop links."""
        if self.parent_run_id is None or not chain:
            return
        self._parent_run_ids([str(r["individual_id"]) for r in chain])   # find runs logged earlier
        champion = str(chain[-1]["individual_id"])
        tags = {"champion_individual_id": champion}
        if champion in self._child_runs:
            tags["champion_run_id"] = self._child_runs[champion]
        for key, value in tags.items():
            self._call("set_tag", self.parent_run_id, key, value)
        self._call("set_tag", self.parent_run_id, NOTE_TAG,
                   champion_note(str(self.run_id), chain, labels, self._child_runs, str(self.experiment_id)))

    def finish(self, status: str = "FINISHED") -> None:
        """Close the parent run (``FINISHED``, ``FAILED`` or ``KILLED``)."""
        if self.parent_run_id is not None:
            self._call("set_terminated", self.parent_run_id, status)

    # ---- rebuild from the archive ---------------------------------------------------------------
    def _logged_rows(self) -> dict[str, str]:
        out: dict[str, str] = {}
        token = None
        while self.experiment_id is not None:
            page = self._call("search_runs", [self.experiment_id],
                              filter_string=f"tags.`{RUN_TAG}` = {_quote(self.run_id)} "
                                            f"and tags.`{KIND_TAG}` = 'individual'",
                              max_results=1000, page_token=token)
            if page is None:
                break
            for run in page:
                out[run.data.tags.get(ROW_TAG, "")] = run.info.run_id
                self._child_runs.setdefault(run.data.tags.get("individual_id", ""), run.info.run_id)
            token = page.token
            if not token:
                break
        return out

    @staticmethod
    def _generation_stats(run_id: str, archive) -> dict[int, dict[str, Any]]:
        """generation -> the statistics the run recorded for it (none for older records)."""
        from archive import ArchiveError

        try:
            records = archive.generations(run_id)
        except ArchiveError:
            return {}
        return {int(g): stats for g, stats in zip(records["generation"], records["stats"], strict=True) if stats}

    def sync(self, run_id: str, archive) -> dict[str, int]:
        """Rebuild the MLflow side of ``run_id`` from ``archive``; rows already logged are skipped.

        Returns counts ``{"logged": ..., "skipped": ..., "generations": ...}``. Archive errors
        (ArchiveError) propagate; MLflow errors are warnings as everywhere else.
        """
        from archive import ArchiveError

        rows = archive.evaluations(run_id)
        try:
            meta = archive.read_run_meta(run_id)
        except ArchiveError:
            meta = {}
        if rows.empty and not meta:
            return {"logged": 0, "skipped": 0, "generations": 0}
        task_key = meta.get("task_key") or (rows["task_key"].iloc[0] if not rows.empty else "unknown")
        self.start_run(run_id, task_key, meta.get("config") or {}, start=meta.get("start"))
        done = self._logged_rows()
        everything = archive.evaluations()
        sources = dict(zip(everything["individual_id"], everything["source"], strict=True))
        logged = skipped = 0
        for record in rows.to_dict("records"):
            if row_key(record) in done:
                skipped += 1
                continue
            parents = [str(p) for p in (_clean(record.get("parent_ids")) or [])]
            self.log_individual(record, sources.get(parents[0]) if parents else None)
            logged += 1
        steps = set()
        if self.parent_run_id is not None:
            history = self._call("get_metric_history", self.parent_run_id, "evaluations") or []
            steps = {m.step for m in history}
        generations = 0
        recorded = self._generation_stats(run_id, archive)
        by_generation = {int(g): group for g, group in rows.groupby("generation", sort=True)}
        for generation in sorted(set(recorded) | set(by_generation)):
            if generation in steps:
                continue
            if generation in recorded:
                self.log_generation_stats(generation, recorded[generation])
            else:   # a run older than its generation records' statistics: from its rows
                group = by_generation[generation]
                speedups = group.loc[group["status"] == "PASS", "speedup_vs_reference"].dropna()
                self.log_generation(generation, speedups.max() if len(speedups) else None,
                                    speedups.median() if len(speedups) else None,
                                    float((group["status"] == "PASS").mean()), len(group))
            generations += 1
        if meta.get("champion_id"):
            from archive import edit_label

            chain = archive.lineage(meta["champion_id"], run_id=run_id)
            self.log_champion(chain, ["seed", *(edit_label(r) for r in chain[1:])])
        if meta.get("status") == "finished":
            self.finish("FINISHED")
        return {"logged": logged, "skipped": skipped, "generations": generations}
