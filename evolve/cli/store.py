"""What the run commands read from a data directory: its archive, a run's record, its champion
and lineage, an individual by id. Shared by ``cli/run`` (run, resume, status) and ``cli/lineage``
(lineage, sync, ui, promote); bad input is one line (a UsageError)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from evolve.cli.common import evolve_command
from evolve.errors import UsageError


def archive_at(data_dir: str, *, create: bool = False):
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


def run_meta(archive, run_id: str) -> dict:
    from archive import ArchiveError

    try:
        return archive.read_run_meta(run_id)
    except (ArchiveError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def number(value) -> float | None:
    """A figure as a float, or None when it is missing (None, NaN, pandas' NA)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def integer(value) -> int | None:
    x = number(value)
    return None if x is None else int(x)


def champion_chain(archive, run_id: str, meta: dict) -> tuple[str | None, list[dict]]:
    """The run's champion id (None: none yet) and its lineage, seed first."""
    from evolve.run import lineage_rows

    champion_id = meta.get("champion_id")
    return champion_id, (lineage_rows(archive, run_id, champion_id) if champion_id else [])


def champion_line(archive, run_id: str, meta: dict) -> str:
    from archive import edit_label

    champion_id, chain = champion_chain(archive, run_id, meta)
    if not champion_id:
        report = (meta.get("no_pass") or {}).get("report")
        return f"champion: none\n{report}" if report else "champion: none yet"
    if not chain:
        return f"champion: {champion_id}"
    row = chain[-1]
    speedup, cycles = number(row.get("speedup_vs_reference")), number(row.get("estimated_cycles"))
    figures = ", ".join(x for x in (f"{speedup:.3f}x the XLA reference" if speedup else "",
                                    f"{int(cycles):,} estimated cycles" if cycles else "")
                        if x)
    path = " -> ".join(["seed", *(edit_label(r) for r in chain[1:])])
    start = start_label(chain[0])
    path += f"\n  start ('seed' above): {start}" if start else ""
    evolve = evolve_command()
    return (f"champion: {champion_id} ({figures})\n  {path}\n"
            f"  '{evolve} lineage {champion_id}' draws it; '{evolve} promote {run_id}' writes it out")


def edit_params(row: dict) -> dict:
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
        speedup = number(row.get("speedup_vs_reference"))
        out.append({
            "individual_id": str(row["individual_id"]), "run_id": row.get("run_id"),
            "generation": int(row["generation"]),
            "parent_ids": [str(p) for p in (row.get("parent_ids") if row.get("parent_ids") is not None else [])],
            "edit": "seed" if row.get("operator") == "seed" else edit_label(row), "operator": row.get("operator"),
            "params": edit_params(row), "status": row.get("status"), "error": row.get("error"),
            "estimated_cycles": integer(row.get("estimated_cycles")), "latency_s": number(row.get("latency_s")),
            "speedup_vs_reference": speedup,
            "speedup_over_parent": speedup / prev if speedup and prev else None,
            "timing_source": row.get("timing_source"), "chip": row.get("chip"),
            "libtpu_version": row.get("libtpu_version"), "task_key": row.get("task_key"),
            "start": start_label(row)})
        prev = speedup or prev
    return out


def start_label(row: dict) -> str | None:
    """The kernel a row's run started from (the archive's ``start`` column; None in runs older
    than the column)."""
    value = row.get("start")
    return value if isinstance(value, str) and value else None


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
