"""Run descriptions for the MLflow UI: markdown with links, so a lineage can be walked by clicking.

MLflow shows a run's ``mlflow.note.content`` tag as its description, rendered as markdown. The UI
routes by the URL's fragment (``#/experiments/E/runs/R``), so a link to a fragment opens the
other run in the same tab. These functions only format text; the tracker writes it.
"""

from __future__ import annotations

import math
from typing import Any

from ._values import clean

NOTE_TAG = "mlflow.note.content"
DIFF_ARTIFACT = "diff_vs_parent.txt"     # .txt: a type the UI previews (.diff and .patch are not)


def run_link(experiment_id: str, run_id: str, text: str) -> str:
    return f"[{text}](#/experiments/{experiment_id}/runs/{run_id})"


def artifact_link(experiment_id: str, run_id: str, path: str, text: str) -> str:
    return f"[{text}](#/experiments/{experiment_id}/runs/{run_id}/artifactPath/{path})"


def run_name(row: dict[str, Any]) -> str:
    return f"g{int(clean(row.get('generation')) or 0):03d}-{row['individual_id']}"


def figures(row: dict[str, Any]) -> str:
    """Speedup, latency and cycles with their timing source, chip and libtpu, in one line."""
    speedup, latency = clean(row.get("speedup_vs_reference")), clean(row.get("latency_s"))
    cycles = clean(row.get("estimated_cycles"))
    parts = []
    if isinstance(speedup, float | int) and math.isfinite(speedup):
        parts.append(f"{speedup:.3f}x the XLA reference")
    if isinstance(latency, float | int) and math.isfinite(latency):
        parts.append(f"{latency * 1e6:.1f} us")
    if isinstance(cycles, float | int) and math.isfinite(cycles):
        parts.append(f"{int(cycles):,} estimated cycles")
    source = ", ".join(str(x) for x in (clean(row.get("timing_source")),
                                        f"chip {clean(row.get('chip'))}" if clean(row.get("chip")) else None,
                                        f"libtpu {clean(row.get('libtpu_version'))}"
                                        if clean(row.get("libtpu_version")) else None) if x)
    return ", ".join(parts) + (f" ({source})" if source and parts else "")


def individual_note(row: dict[str, Any], label: str, *, experiment_id: str, own_run_id: str,
                    evolution_run_id: str | None, evolution_run_name: str,
                    parents: list[tuple[str, str | None]], has_diff: bool) -> str:
    """The description of one individual's run. The links come first: the UI shows the top of a
    long description and hides the rest behind "Show more"."""
    roles = ["first parent", "second parent (crossover)"]
    links = []
    for i, (ind, mlflow_run) in enumerate(parents):
        role = roles[i] if i < len(roles) else f"parent {i + 1}"
        links.append(f"{role}: " + (run_link(experiment_id, mlflow_run, ind) if mlflow_run else
                                    f"{ind} (not logged in this store)"))
    top = "; ".join(links) if links else "Parents: none, this is the seed"
    if evolution_run_id:
        top += " · evolution run: " + run_link(experiment_id, evolution_run_id, evolution_run_name)
    status = str(clean(row.get("status")) or "?")
    lines = [top, "", f"**{status}** · {label} · generation {int(clean(row.get('generation')) or 0)}"]
    if has_diff:
        lines[-1] += " · " + artifact_link(experiment_id, own_run_id, DIFF_ARTIFACT,
                                           "the diff against the first parent")
    shown = figures(row)
    if shown:
        lines += ["", shown]
    error = clean(row.get("error"))
    if status != "PASS" and error:
        stage = clean(row.get("stage"))
        lines += ["", f"Why it did not pass{f' (stage {stage})' if stage else ''}: {str(error)[:600]}"]
    if clean(row.get("copy_trap")):
        lines += ["", "Warning, copy trap: the compiled program copies data outside the kernel (an XLA "
                  "`copy`, e.g. a layout change of an input or the output). It is counted in the "
                  "figures above; it is work the kernel's own tiling did not remove."]
    return "\n".join(lines)


def champion_note(run_name_: str, chain: list[dict[str, Any]], labels: list[str],
                  child_runs: dict[str, str], experiment_id: str) -> str:
    """The evolution run's description: its champion and the chain from the seed, each hop a link."""
    champion = chain[-1]
    head = run_link(experiment_id, child_runs[champion["individual_id"]], run_name(champion)) \
        if champion["individual_id"] in child_runs else run_name(champion)
    lines = [f"Champion: {head}, {figures(champion)}", "",
             f"Evolution run {run_name_}, from the seed to the champion (first parents):", ""]
    for i, (row, label) in enumerate(zip(chain, labels, strict=True)):
        ind = row["individual_id"]
        name = run_link(experiment_id, child_runs[ind], run_name(row)) if ind in child_runs else run_name(row)
        speedup = clean(row.get("speedup_vs_reference"))
        sp = f" — {speedup:.3f}x" if isinstance(speedup, float | int) and math.isfinite(speedup) else ""
        lines.append(f"{i + 1}. {name}: {label}{sp}")
    return "\n".join(lines)
