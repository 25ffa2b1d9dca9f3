"""The Parquet schema of the archive and the conversion of one evaluation dict into a row."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import pyarrow as pa

from evaluator import METRIC_COLUMNS, METRIC_PAIRS, EvalResult, Metrics, Provenance

from ._identity import individual_id as _individual_id

# The metrics' columns and types come from the Metrics dataclass (evaluator/result.py): a new
# metric is one edit there. Existing columns keep their names and types (tests/archive pins them),
# so older archives still read; a column added later reads as nulls in older files (conform).
_ARROW_TYPES: dict[type, pa.DataType] = {float: pa.float64(), int: pa.int64(), str: pa.string(),
                                         bool: pa.bool_()}
_METRIC_TYPES: dict[str, pa.DataType] = {name: _ARROW_TYPES[kind] for name, kind in METRIC_COLUMNS.items()}

SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("individual_id", pa.string(), nullable=False),
        pa.field("parent_ids", pa.list_(pa.string())),
        pa.field("operator", pa.string()),
        pa.field("params", pa.string()),       # JSON object: the last edit's parameters
        pa.field("edits", pa.string()),        # JSON list of {"op": ..., "params": ...}, seed first
        pa.field("tunables", pa.string()),     # JSON object: block sizes etc. of this source
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("task_key", pa.string(), nullable=False),
        pa.field("chip", pa.string()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("stage", pa.string()),
        *(pa.field(name, typ) for name, typ in _METRIC_TYPES.items()),
        pa.field("timing_source", pa.string()),
        pa.field("jax_version", pa.string()),
        pa.field("jaxlib_version", pa.string()),
        pa.field("libtpu_version", pa.string()),
        pa.field("correctness_sets", pa.int64()),
        pa.field("secret_sets", pa.int64()),
        pa.field("wall_time_s", pa.float64()),
        pa.field("from_archive", pa.bool_()),   # this run took the verdict from the archive
        # Where the run's first kernel came from (evolve/start/resolve.py's label: the seed, a module with its
        # distribution and version, or a file; each with the source's sha256); null in older archives.
        pa.field("start", pa.string()),
        pa.field("log_tail", pa.string()),
        pa.field("evaluated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
COLUMNS = tuple(SCHEMA.names)

_REQUIRED = ("run_id", "source", "status", "task_key", "generation")
_JSON_COLUMNS = {"params": "{}", "edits": "[]", "tunables": "{}"}
# Keys accepted besides the columns: what EvalResult.to_dict() gives and a few conveniences.
_ACCEPTED = set(COLUMNS) | {f.name for f in dataclasses.fields(Metrics)} | {
    f.name for f in dataclasses.fields(Provenance)}


def _json(value: Any, default: str) -> str:
    if value is None:
        return default
    if isinstance(value, str):
        json.loads(value)   # must already be JSON
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _utc(value: Any) -> dt.datetime:
    if value is None:
        return dt.datetime.now(dt.UTC)
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if hasattr(value, "to_pydatetime"):
        value = value.to_pydatetime()
    if not isinstance(value, dt.datetime):
        raise TypeError(f"evaluated_at must be a datetime or ISO string, got {value!r}")
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def normalize_row(row: dict[str, Any]) -> dict[str, Any]:
    """One evaluation as a dict with exactly the archive's columns.

    Accepts what :func:`make_row` builds, or any dict with the column names; ``params``,
    ``edits`` and ``tunables`` may be Python objects (JSON-encoded here); a pair metric such as
    ``latency_ci_s`` may be given as a pair (split into ``latency_ci_lo_s`` / ``latency_ci_hi_s``);
    ``individual_id`` defaults to the hash of ``source`` and ``evaluated_at`` to now (UTC). Raises
    ValueError on missing or unknown keys.
    """
    unknown = set(row) - _ACCEPTED
    if unknown:
        raise ValueError(f"unknown archive column(s) {sorted(unknown)}; known: {', '.join(COLUMNS)}")
    missing = [k for k in _REQUIRED if row.get(k) is None]
    if missing:
        raise ValueError(f"archive row lacks required field(s) {missing}")
    out: dict[str, Any] = {name: row.get(name) for name in COLUMNS}
    for name, (lo_column, hi_column) in METRIC_PAIRS.items():
        if row.get(name) is not None:
            lo, hi = row[name]
            out[lo_column], out[hi_column] = float(lo), float(hi)
    if out["individual_id"] is None:
        out["individual_id"] = _individual_id(out["source"])
    status = out["status"]
    out["status"] = getattr(status, "value", status)
    out["parent_ids"] = [str(p) for p in (out["parent_ids"] or [])]
    for name, default in _JSON_COLUMNS.items():
        out[name] = _json(out[name], default)
    out["generation"] = int(out["generation"])
    out["evaluated_at"] = _utc(out["evaluated_at"])
    for name in ("error", "stage", "log_tail"):
        out[name] = out[name] or ""
    return out


def make_row(*, run_id: str, source: str, result: EvalResult, task_key: str, generation: int,
             parent_ids: list[str] | tuple[str, ...] = (), operator: str | None = None,
             params: dict | None = None, edits: list[dict] | None = None,
             tunables: dict | None = None, chip: str | None = None,
             evaluated_at: dt.datetime | None = None, from_archive: bool = False,
             start: str | None = None) -> dict[str, Any]:
    """The archive row of one evaluation (``chip`` defaults to the result's provenance chip;
    ``from_archive``: the verdict was read back, not judged, so its seconds were not spent here;
    ``start``: the label of the kernel the run started from)."""
    data = result.to_dict()
    data.update(run_id=run_id, source=source, task_key=task_key, generation=generation,
                parent_ids=list(parent_ids), operator=operator, params=params or {},
                edits=edits or [], tunables=tunables or {}, evaluated_at=evaluated_at,
                from_archive=from_archive, start=start)
    data["chip"] = chip if chip is not None else data.get("chip")
    return normalize_row(data)


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist([normalize_row(r) for r in rows], schema=SCHEMA)


def conform(table: pa.Table) -> pa.Table:
    """Cast a table read from disk to SCHEMA (columns missing in older files become nulls)."""
    arrays = []
    for field in SCHEMA:
        if field.name in table.column_names:
            arrays.append(table.column(field.name).cast(field.type))
        elif field.nullable:
            arrays.append(pa.nulls(table.num_rows, field.type))
        else:
            raise ValueError(f"column {field.name!r} is missing")
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def row_to_result_dict(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row with its pairs (``latency_ci_s``) rebuilt, so ``EvalResult.from_dict(row)`` works."""
    out = dict(row)
    for name, (lo_column, hi_column) in METRIC_PAIRS.items():
        lo, hi = out.get(lo_column), out.get(hi_column)
        out[name] = [lo, hi] if lo is not None and hi is not None else None
    return out


def edit_label(row: dict[str, Any]) -> str:
    """``operator(k=v, ...)`` for a stored row (its params are JSON text in the archive); a chain
    of edits made in one move reads ``op1(k=v) + op2``."""
    op = row.get("operator")
    op = op if isinstance(op, str) and op else "edit"
    params = row.get("params")
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            params = None
    if isinstance(params, dict) and isinstance(params.get("chain"), list):
        return " + ".join(edit_label({"operator": e.get("op"), "params": e.get("params") or {}})
                          for e in params["chain"] if isinstance(e, dict))
    if isinstance(params, dict) and params:
        return f"{op}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})"
    return op
