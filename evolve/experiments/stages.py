"""Where a run's worker time went: seconds per judging stage, from the run's own archive rows.

Only rows the run judged itself count (``from_archive`` false): a verdict read back from the
archive cost nothing here. Stages, per judged kernel:

* ``worker``: the jailed worker, start-up, loading the candidate and tracing it once;
* ``runner start``: the trusted runner's own start-up (imports, reading the program);
* ``lower``: the runner lowering the jaxpr for the TPU and the CPU interpreter, and the audit;
* ``compile``: the TPU compiler with the estimate (or for the chip), a compile that fails included;
* ``counting``: loops, branches and DMAs on data counted, and their variants compiled (``trips``,
  ``traffic``);
* ``correctness``: the CPU program (or the chip) on every input set;
* ``timing``: timed runs on a TPU host;
* ``judge``: what is left of the kernel's wall time (screen, inputs, comparison, archive).

A kernel judged since the runner's stages are timed as announced (``runner_stage_seconds``) is
split by them. An older row has only the stages' own timers, and its ``runner start`` is what they
leave of the runner's time: a compile that failed, or the counting stages, fell there.
"""

from __future__ import annotations

import json

import pandas as pd

STAGES = ("worker", "runner start", "lower", "compile", "counting", "correctness", "timing", "judge")
# The runner's announced stages (evaluator/runner.py), by the row of the table they count in.
RUNNER_ROWS = {"start": "runner start", "load": "runner start", "lower": "lower", "audit": "lower",
               "same": "lower", "compile": "compile", "prune": "compile", "trips": "counting",
               "traffic": "counting", "correctness": "correctness", "timing": "timing"}
# Time spent on anything but the kernel's own lowering, compile, check and timing (issue 59).
OUTSIDE = ("worker", "runner start", "judge")


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name].fillna(0.0).astype(float) if name in df.columns else pd.Series(0.0, index=df.index)


def stage_seconds(df: pd.DataFrame) -> dict[str, float]:
    """Total seconds per stage over the kernels ``df`` judged (not read back)."""
    if "from_archive" in df.columns:
        df = df[~df["from_archive"].fillna(False).astype(bool)]
    worker, runner = _col(df, "sandbox_time_s"), _col(df, "runner_time_s")
    out = dict.fromkeys(STAGES, 0.0)
    out["worker"] = float(worker.sum())
    out["judge"] = float((_col(df, "wall_time_s") - worker - runner).clip(lower=0).sum())
    announced = df["runner_stage_seconds"] if "runner_stage_seconds" in df.columns else pd.Series(None, index=df.index)
    for i, text in announced.items():
        stages = _parsed(text)
        if stages is not None:
            for name, seconds in stages.items():
                row = RUNNER_ROWS.get(name, "runner start")
                out[row] += float(seconds)
            continue
        parts = {name: float(_col(df.loc[[i]], f"{name}_time_s").iloc[0])
                 for name in ("lower", "compile", "correctness", "timing")}
        for name, seconds in parts.items():
            out[name] += seconds
        out["runner start"] += max(float(runner.loc[i]) - sum(parts.values()), 0.0)
    return out


def _parsed(text) -> dict[str, float] | None:
    if not isinstance(text, str):
        return None
    try:
        stages = json.loads(text)
    except ValueError:
        return None
    return stages if isinstance(stages, dict) else None


def child_stages(df: pd.DataFrame, column: str) -> tuple[dict[str, float], int]:
    """Seconds per stage a child announced (``start``: before its first), summed over the kernels
    judged here that recorded them (``Metrics.worker_stage_seconds`` / ``runner_stage_seconds``),
    and how many did."""
    out: dict[str, float] = {}
    if column not in df.columns:
        return out, 0
    if "from_archive" in df.columns:
        df = df[~df["from_archive"].fillna(False).astype(bool)]
    counted = 0
    for text in df[column].dropna():
        stages = _parsed(text)
        if stages is None:
            continue
        counted += 1
        for name, seconds in stages.items():
            out[name] = out.get(name, 0.0) + float(seconds)
    return out, counted


def format_breakdown(df: pd.DataFrame, workers: int | None = None) -> str:
    """A table of where the worker time went, with kernels judged per minute of run time and,
    given the run's number of workers, how busy they were while it judged."""
    judged = df[~df["from_archive"].fillna(False).astype(bool)] if "from_archive" in df.columns else df
    seconds = stage_seconds(df)
    total = sum(seconds.values())
    lines = [f"worker time by stage ({len(judged)} kernels judged, {len(df) - len(judged)} read back "
             "from the archive):", "| stage | seconds | share | per judged kernel |", "|---|---|---|---|"]
    for name in STAGES:
        share = seconds[name] / total if total else 0.0
        per = seconds[name] / len(judged) if len(judged) else 0.0
        lines.append(f"| {name} | {seconds[name]:.1f} | {share:.0%} | {per:.1f} s |")
    lines.append(f"| all | {total:.1f} | 100% | {total / len(judged) if len(judged) else 0.0:.1f} s |")
    for child, column in (("worker", "worker_stage_seconds"), ("runner", "runner_stage_seconds")):
        parts, counted = child_stages(df, column)
        if parts and counted:
            lines.append(f"the {child}'s stages, per kernel that recorded them ({counted}): "
                         + ", ".join(f"{k} {v / counted:.1f} s" for k, v in parts.items()))
    if "log_tail" in judged.columns and len(judged):
        again = int(judged["log_tail"].fillna("").str.startswith("judged once").sum())
        programs = judged["program_sha256"].dropna().nunique() if "program_sha256" in judged.columns else 0
        lines.append(f"same program: {again} of {len(judged)} judged kernels lowered to a program judged before "
                     f"(its verdict given again, no compile); {programs} distinct programs")
    outside = sum(seconds[name] for name in OUTSIDE)
    lines.append(f"outside the runner's own stages ({' + '.join(OUTSIDE)}): "
                 f"{outside / total if total else 0.0:.0%} of worker time")
    if len(judged) and "evaluated_at" in judged.columns:
        ends = pd.to_datetime(judged["evaluated_at"], utc=True)
        starts = ends - pd.to_timedelta(_col(judged, "wall_time_s"), unit="s")
        span = (ends.max() - starts.min()).total_seconds()
        if span > 0:
            lines.append(f"run time judging: {span / 60:.1f} min; {len(judged) / (span / 60):.2f} kernels "
                         "judged per minute")
            if workers:
                busy = float(_col(judged, "wall_time_s").sum())
                lines.append(f"workers busy: {busy / (workers * span):.0%} of {workers} x {span / 60:.1f} min")
    by_status = judged["status"].value_counts().to_dict() if len(judged) else {}
    lines.append("judged kernels by status: " + (", ".join(f"{k} {v}" for k, v in sorted(by_status.items()))
                                                 or "-"))
    return "\n".join(lines)
