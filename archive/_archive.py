"""The append-only Parquet archive of every evaluation, and the run records ``resume`` needs.

Layout under the data directory::

    archive/run=<run_id>/batch-g<generation>-n<rows>-<uuid>.parquet   one file per appended batch
    runs/<run_id>.json                                                  run metadata (config, seed, status)
    runs/<run_id>/gen-<generation>-<uuid>.json                          search state after a generation

Every file is written under a `_`-prefixed temporary name, fsync'd, renamed into place and
its directory fsync'd. Readers skip `_` names; opening removes those whose writer died.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import _fs
from ._errors import ArchiveError
from ._schema import conform, empty_table, row_to_result_dict, rows_to_table

# The one home of the default data directory; PALLAS_EVOLVE_DATA_DIR overrides it.
DEFAULT_DATA_DIR = Path(os.environ.get("PALLAS_EVOLVE_DATA_DIR") or "evolve_data")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PANDAS_TYPES = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
# Older records also hold an "rng_state" nobody read (a run replays from its RNG seed): ignored.
_GEN_COLUMNS = ["run_id", "generation", "population_ids", "hall_of_fame_ids", "stats", "written_at"]


def _check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ValueError(f"bad run id {run_id!r}: use letters, digits, '.', '_' or '-' "
                         "(at most 128, not starting with '.', '_' or '-')")
    return run_id


def _parents(value: Any) -> list[str]:
    return [] if value is None else [str(p) for p in value]


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas(types_mapper=_PANDAS_TYPES.get)


class Archive:
    """Every evaluation ever made, as Parquet files under ``<data_dir>/archive``.

    ``create=False`` refuses a data directory that does not exist (for commands that only
    read), instead of silently creating an empty one.
    """

    def __init__(self, data_dir: str | os.PathLike = DEFAULT_DATA_DIR, *, create: bool = True):
        self.data_dir = Path(data_dir)
        self.archive_dir = self.data_dir / "archive"
        self.runs_dir = self.data_dir / "runs"
        self._cache: dict[Path, pa.Table] = {}   # files never change once renamed into place
        self._concat: tuple[tuple[Path, ...], pa.Table] | None = None   # last whole-archive read
        if self.data_dir.exists() and not self.data_dir.is_dir():
            raise ArchiveError(f"data directory {self.data_dir} is a file, not a directory; "
                               "pass --data-dir pointing at a directory")
        if not self.data_dir.exists():
            if not create:
                raise ArchiveError(f"no data directory at {self.data_dir}; check --data-dir "
                                   "(a run creates it)")
            try:
                self.data_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ArchiveError(f"cannot create data directory {self.data_dir} ({exc.strerror}); "
                                   "choose a writable --data-dir") from None
        if not os.access(self.data_dir, os.R_OK | os.X_OK):
            raise ArchiveError(f"data directory {self.data_dir} is not readable; fix its "
                               "permissions or choose another --data-dir")
        self.removed_temps = self._remove_stray_temps()

    def _remove_stray_temps(self) -> list[Path]:
        removed = []
        for root in (self.archive_dir, self.runs_dir):
            try:
                removed += _fs.remove_stray_temps(root)
            except OSError:
                pass   # a read-only data dir is still readable; nothing to clean then
        return removed

    # ---- evaluations -------------------------------------------------------------------
    def append(self, rows: list[dict[str, Any]]) -> Path:
        """Store one batch of evaluation rows of one run durably; return the file written.

        Rows follow :func:`archive.make_row` (or the column names; see ``normalize_row``).
        """
        if not rows:
            raise ValueError("append() needs at least one row")
        table = rows_to_table(rows)
        run_ids = set(table.column("run_id").to_pylist())
        if len(run_ids) != 1:
            raise ValueError(f"one batch holds rows of one run, got {sorted(run_ids)}")
        run_id = _check_run_id(run_ids.pop())
        generation = pc.max(table.column("generation")).as_py()
        name = f"batch-g{generation:06d}-n{table.num_rows}-{uuid.uuid4().hex}.parquet"
        path = self.archive_dir / f"run={run_id}" / name

        def write(f):
            pq.write_table(table, f, compression="zstd")

        for attempt in range(2):   # a cleaner in another process may remove our temp: retry once
            try:
                _fs.atomic_write(path, write)
                break
            except FileNotFoundError:
                if attempt:
                    raise
            except OSError as exc:
                raise ArchiveError(f"cannot write {path} ({exc.strerror}); free space or fix the "
                                   f"permissions of {self.archive_dir}") from None
        self._cache[path] = table
        return path

    def _files(self, run_id: str | None) -> list[Path]:
        if not self.archive_dir.exists():
            return []
        if run_id is not None:
            dirs = [self.archive_dir / f"run={_check_run_id(run_id)}"]
        else:
            dirs = sorted(p for p in self.archive_dir.iterdir()
                          if p.is_dir() and p.name.startswith("run="))
        files: list[Path] = []
        for d in dirs:
            if d.is_dir():
                files += sorted(p for p in d.iterdir()
                                if p.suffix == ".parquet" and not p.name.startswith(_fs.TEMP_PREFIX))
        return files

    def _read(self, path: Path) -> pa.Table:
        table = self._cache.get(path)
        if table is None:
            try:
                table = conform(pq.read_table(path))
            except PermissionError:
                raise ArchiveError(f"archive file {path} is not readable; fix its permissions") from None
            except Exception as exc:  # noqa: BLE001 (pyarrow raises many kinds for a bad file)
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ArchiveError(f"archive file {path} is corrupt ({why[:160]}); move it out of "
                                   f"{self.archive_dir} (keep a copy) and run again") from None
            self._cache[path] = table
        return table

    def table(self, run_id: str | None = None) -> pa.Table:
        """All evaluations (of one run) as one Arrow table in SCHEMA, oldest first."""
        files = tuple(self._files(run_id))
        if run_id is None and self._concat is not None and self._concat[0] == files:
            return self._concat[1]
        tables = [self._read(p) for p in files]
        table = pa.concat_tables(tables).sort_by([("evaluated_at", "ascending")]) if tables else empty_table()
        if run_id is None:
            self._concat = (files, table)
        return table

    def evaluations(self, run_id: str | None = None) -> pd.DataFrame:
        """All evaluations (of one run), one row each, oldest first."""
        return _to_pandas(self.table(run_id)).reset_index(drop=True)

    def ancestry(self, individual_id: str, run_id: str | None = None) -> pd.DataFrame:
        """The individual and all its ancestors, the individual first, each once.

        Each individual is represented by its first evaluation (the one that records how it
        was made). Columns added: ``depth`` (0 for the individual, 1 for its parents...) and
        ``first_parent_chain`` (True on the line individual -> first parent -> ... -> seed).
        Empty if the individual is not in the archive. An individual's id is its source's hash,
        so the same kernel can stand in several runs (of other tasks too): without ``run_id``
        the ancestry is read in the latest run that evaluated it, never mixed across runs.
        """
        df = self.evaluations(run_id)
        if run_id is None and not df.empty:
            mine = df[df["individual_id"] == individual_id]
            if not mine.empty:
                latest = mine.sort_values("evaluated_at").iloc[-1]["run_id"]
                df = df[df["run_id"] == latest]
        first = df.drop_duplicates("individual_id", keep="first").set_index("individual_id", drop=False)
        order: list[tuple[str, int]] = []
        seen: set[str] = set()
        frontier = [individual_id]
        depth = 0
        while frontier:
            nxt: list[str] = []
            for ind in frontier:
                if ind in seen or ind not in first.index:
                    continue
                seen.add(ind)
                order.append((ind, depth))
                nxt += _parents(first.at[ind, "parent_ids"])
            frontier, depth = nxt, depth + 1
        chain: set[str] = set()
        ind = individual_id
        while ind in first.index and ind not in chain:
            chain.add(ind)
            parents = _parents(first.at[ind, "parent_ids"])
            ind = parents[0] if parents else None
        out = first.loc[[i for i, _ in order]].reset_index(drop=True)
        out["depth"] = pd.array([d for _, d in order], dtype="Int64")
        out["first_parent_chain"] = [i in chain for i, _ in order]
        return out

    def lineage(self, individual_id: str, run_id: str | None = None) -> list[dict]:
        """Seed -> individual, following first parents, as rows (one per individual)."""
        df = self.ancestry(individual_id, run_id=run_id)
        if df.empty:
            return []
        rows = df[df["first_parent_chain"].astype(bool)].to_dict("records")
        rows.sort(key=lambda r: r.get("depth", 0), reverse=True)
        return rows

    def best(self, task_key: str | None = None, chip: str | None = None,
             timing_source: str | None = None) -> pd.DataFrame:
        """The fastest PASS row per (task_key, chip, timing_source) by speedup_vs_reference."""
        df = self.evaluations()
        mask = (df["status"] == "PASS") & df["speedup_vs_reference"].notna()
        for col, value in (("task_key", task_key), ("chip", chip), ("timing_source", timing_source)):
            if value is not None:
                mask &= df[col] == value
        df = df[mask]
        if df.empty:
            return df.reset_index(drop=True)
        keys = ["task_key", "chip", "timing_source"]
        idx = df.groupby(keys, dropna=False, sort=True)["speedup_vs_reference"].idxmax()
        return df.loc[idx.to_numpy()].sort_values(keys).reset_index(drop=True)

    def lookup(self, individual_id: str, task_key: str, chip: str | None, timing_source: str | None,
               libtpu_version: str | None) -> dict[str, Any] | None:
        """The latest stored evaluation of this source under these conditions, else None.

        A row matches when individual_id, task_key and chip are equal and its timing_source and
        libtpu_version are equal to the ones asked for, or missing because the evaluation
        stopped before they were known (a screen or lowering failure holds for any of them).
        Exact matches are preferred. Figures of other timing sources or libtpu versions never
        match. The dict has the column names plus ``latency_ci_s``, for EvalResult.from_dict.
        """
        table = self.table()
        mask = pc.and_(pc.equal(table["individual_id"], individual_id),
                       pc.equal(table["task_key"], task_key))
        table = table.filter(mask)
        best: tuple[int, dt.datetime] | None = None
        found = None
        for row in table.to_pylist():
            if row["chip"] != chip:
                continue
            score = 0
            for col, want in (("timing_source", timing_source), ("libtpu_version", libtpu_version)):
                if row[col] == want:
                    score += 1
                elif row[col] is not None:
                    break
            else:
                key = (score, row["evaluated_at"])
                if best is None or key >= best:
                    best, found = key, row
        return row_to_result_dict(found) if found is not None else None

    def runs(self) -> pd.DataFrame:
        """One row per run: evaluations, generations, passes, best speedup, first/last time, status."""
        df = self.evaluations()
        columns = ["run_id", "task_key", "status", "evaluations", "generations", "passed",
                   "best_speedup", "first_evaluated_at", "last_evaluated_at"]
        records = {}
        for run_id, g in df.groupby("run_id", sort=True):
            passed = g[g["status"] == "PASS"]
            records[run_id] = {
                "run_id": run_id, "task_key": g["task_key"].iloc[0], "status": None,
                "evaluations": len(g), "generations": int(g["generation"].nunique()),
                "passed": len(passed), "best_speedup": passed["speedup_vs_reference"].max(),
                "first_evaluated_at": g["evaluated_at"].min(), "last_evaluated_at": g["evaluated_at"].max()}
        for run_id in self.list_runs():
            meta = self.read_run_meta(run_id)
            rec = records.setdefault(run_id, {"run_id": run_id, "evaluations": 0, "generations": 0,
                                              "passed": 0, "task_key": meta.get("task_key")})
            rec["status"] = meta.get("status")
        out = pd.DataFrame([records[k] for k in sorted(records)], columns=columns)
        return out.astype({"evaluations": "int64", "generations": "int64", "passed": "int64",
                           "best_speedup": "float64",
                           "first_evaluated_at": "datetime64[us, UTC]",
                           "last_evaluated_at": "datetime64[us, UTC]"})

    # ---- runs: metadata and per-generation state for resume -----------------------------
    def _write_json(self, path: Path, data: dict[str, Any]) -> Path:
        text = json.dumps(data, indent=2, sort_keys=True, default=str).encode("utf-8")
        try:
            return _fs.atomic_write(path, lambda f: f.write(text))
        except OSError as exc:
            raise ArchiveError(f"cannot write {path} ({exc.strerror}); free space or fix the "
                               f"permissions of {path.parent}") from None

    def _read_json(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ArchiveError(f"cannot read {path} ({exc.strerror}); fix its permissions") from None
        except ValueError as exc:
            raise ArchiveError(f"{path} is not valid JSON ({exc}); move it out of {path.parent} "
                               "(keep a copy) and run again") from None
        if not isinstance(data, dict):
            raise ArchiveError(f"{path} does not hold a JSON object; move it out of {path.parent}")
        return data

    def write_run_meta(self, run_id: str, meta: dict[str, Any]) -> Path:
        """Store (or replace, atomically) the run's record: config, RNG seed, status..."""
        path = self.runs_dir / f"{_check_run_id(run_id)}.json"
        return self._write_json(path, {**meta, "run_id": run_id})

    def read_run_meta(self, run_id: str) -> dict[str, Any]:
        """The run's record; ArchiveError if there is none."""
        path = self.runs_dir / f"{_check_run_id(run_id)}.json"
        if not path.exists():
            known = ", ".join(self.list_runs()[-5:]) or "none"
            raise ArchiveError(f"no run {run_id!r} in {self.data_dir} (latest runs: {known}); "
                               "check the run id and --data-dir")
        return self._read_json(path)

    def list_runs(self) -> list[str]:
        """The ids of the runs with a record, sorted."""
        if not self.runs_dir.is_dir():
            return []
        return sorted(p.stem for p in self.runs_dir.glob("*.json")
                      if not p.name.startswith(_fs.TEMP_PREFIX))

    def append_generation(self, run_id: str, generation: int, population_ids: list[str],
                          hall_of_fame_ids: list[str], stats: dict[str, Any] | None = None) -> Path:
        """Store the search state after ``generation`` and its statistics (the search's logbook
        record), as a new file; nothing is overwritten."""
        generation = int(generation)
        path = self.runs_dir / _check_run_id(run_id) / f"gen-{generation:06d}-{uuid.uuid4().hex}.json"
        return self._write_json(path, {
            "run_id": run_id, "generation": generation, "population_ids": list(population_ids),
            "hall_of_fame_ids": list(hall_of_fame_ids), "stats": dict(stats or {}),
            "written_at": dt.datetime.now(dt.UTC).isoformat()})

    def generations(self, run_id: str) -> pd.DataFrame:
        """One row per generation stored for the run (the latest record if written twice);
        ``stats`` is empty for records older than the statistics."""
        directory = self.runs_dir / _check_run_id(run_id)
        records = []
        if directory.is_dir():
            for path in sorted(directory.glob("gen-*.json")):
                records.append(self._read_json(path))
        df = pd.DataFrame(records, columns=_GEN_COLUMNS)
        if df.empty:
            return df.astype({"generation": "int64"})
        df["written_at"] = pd.to_datetime(df["written_at"], utc=True, format="ISO8601")
        df["stats"] = [s if isinstance(s, dict) else {} for s in df["stats"]]
        df = df.sort_values(["generation", "written_at"]).drop_duplicates("generation", keep="last")
        return df.reset_index(drop=True)
