"""Promote a run's champion: re-judge it (never taken on trust), write it out with a docstring that
says what it is and how to call it, and register it in MLflow's model registry with its provenance.

``evolve promote RUN`` is the command (evolve/cli/lineage.py); this is what it decides."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from evolve.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Promotion:
    """What promoting did. ``status`` "PROMOTED", or "FAILED" (the champion no longer passes the
    judge: ``error`` says how, and nothing was written or registered)."""
    status: str
    champion_id: str
    error: str | None = None
    path: Path | None = None
    name: str | None = None
    version: Any = None

    @property
    def ok(self) -> bool:
        return self.status == "PROMOTED"


def promote_champion(archive, data_dir: str, run_id: str, meta: dict, *, to: str | None = None,
                     name: str | None = None) -> Promotion:
    from archive import edit_label
    from evaluator import Judge
    from evolve.config import RunConfig
    from evolve.run import lineage_rows
    from mlflow_runs import (call_spec, champion_header, ensure_store, example_inputs, individual_run,
                             register_champion, run_link, with_docstring)
    from mutations import discover, parse, read_tunables

    champion_id = meta.get("champion_id")
    if not champion_id:
        raise UsageError(f"run {run_id} has no champion yet; let it finish or 'evolve resume {run_id}'")
    config = RunConfig.from_dict(meta["config"])
    task = config.task.task()
    chain = lineage_rows(archive, run_id, champion_id)
    source = chain[-1]["source"]
    result = Judge(config.judge.judge_config(data_dir)).evaluate(source, task)   # re-verified
    if not result.ok:
        return Promotion("FAILED", champion_id, error=f"{result.status.value}: {result.error}")
    # a reference file's task by its file's name (reference_name: the key's first part), not "reference"
    name = name or re.sub(r"[^A-Za-z0-9_.-]", "_", f"{task.key.split('/')[0]}_{config.judge.chip}")
    found = individual_run(data_dir, run_id, champion_id)
    link = f"http://127.0.0.1:5000/#/experiments/{found[0]}/runs/{found[1]}" if found else None
    tunables = read_tunables(source)
    found_tunables = {t.name: t.value for t in discover(parse(source), task).values() if len(t.legal) > 1}
    header = champion_header(name=name, run_id=run_id, individual_id=champion_id,
                             lineage=[edit_label(r) for r in chain[1:]], task=task, result=result,
                             tunables={**found_tunables, **tunables},
                             run_link=link + " (with 'evolve ui')" if link else None)
    promoted = with_docstring(source, header)
    out = Path(to or f"champion-{run_id}.py")
    out.write_text(promoted)
    ensure_store(data_dir)
    m, p = result.metrics, result.provenance
    provenance = {"run_id": run_id, "individual_id": champion_id, "task_key": task.key,
                  "individual_mlflow_run": found[1] if found else None, "status": result.status.value,
                  "timing_source": p.timing_source, "chip": p.chip, "libtpu_version": p.libtpu_version,
                  "jax_version": p.jax_version, "latency_s": m.latency_s, "estimated_cycles": m.estimated_cycles,
                  "speedup_vs_reference": m.speedup_vs_reference, "max_abs_error": m.max_abs_error}
    description = "```\n" + header + "\n```" + (
        f"\n\nThe individual's run, with its lineage: {run_link(found[0], found[1], champion_id)}"
        if found else "")
    with quiet_registration():
        version = register_champion(promoted, name, provenance, call=call_spec(task), description=description,
                                    example=example_inputs(task, tunables), data_dir=data_dir)
    return Promotion("PROMOTED", champion_id, path=out, name=name, version=version)


# The registry checks the champion on its input example in this process: on the CPU, in Pallas'
# interpreter (the judge's verdict is the one that counts, and a run may hold the TPU), with libtpu
# and gRPC silent (their "E0000 ... unexpected worker hostname" lines say nothing about the kernel).
QUIET_ENV = {"JAX_PLATFORMS": "cpu", "TPU_MIN_LOG_LEVEL": "3", "TPU_STDERR_LOG_LEVEL": "3", "GRPC_VERBOSITY": "NONE",
             "TF_CPP_MIN_LOG_LEVEL": "3", "MLFLOW_LOGGING_LEVEL": "ERROR"}


@contextlib.contextmanager
def quiet_registration():
    """Register without MLflow's chatter: its warnings (type hints on ``predict``), its INFO lines
    and the lines it prints ("Successfully registered model ..."; promote says what it did in its
    own line), and no TPU runtime or gRPC log lines from JAX in this process or a child it starts.
    MLflow's errors are raised, not printed: nothing is hidden that promote would not report.
    MLflow's own switch, counted: its inner uses (in log_model) do not turn the chatter back on."""
    from mlflow.utils.autologging_utils.logging_and_warnings import MlflowEventsAndWarningsBehaviorGlobally

    saved = {k: os.environ.get(k) for k in QUIET_ENV}
    os.environ.update({k: v for k, v in QUIET_ENV.items() if k == "JAX_PLATFORMS" or os.environ.get(k) is None})
    _jax_on_cpu()
    try:
        with MlflowEventsAndWarningsBehaviorGlobally(disable_event_logs=True, disable_warnings=True,
                                                     reroute_warnings=False):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _jax_on_cpu() -> None:
    """JAX in this process on the CPU, when it has not chosen its backends yet (the judge's own
    children are not this process: they keep theirs)."""
    import sys

    if "jax" not in sys.modules:
        return
    import jax
    from jax._src import xla_bridge

    if not getattr(xla_bridge, "_backends", None):
        jax.config.update("jax_platforms", "cpu")
