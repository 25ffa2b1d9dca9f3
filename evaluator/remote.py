"""Judging on another machine: one task's judge as data, and what runs on the node.

A ``JudgeSpec`` is everything a node needs to judge candidates of one task exactly as the
orchestrator's judge would, and nothing it would have to find on its own disk:

* the judge's configuration (chip, the timing source the orchestrator resolved, the stage
  budgets, the process limits), so a node never picks another timing source;
* the task as its task.py text and fields (a seed directory need not exist on the node);
* what the orchestrator's judge made once: the reference timing and the ground truth (inputs,
  f32 truth, the XLA program's outputs), so a node never re-times the reference;
* the provenance the orchestrator archives verdicts under: a node whose jax, jaxlib or libtpu
  differ would judge by another compiler, and says so (CRASH with the reason) instead.

``judge_on_this_node(spec, source, cut)`` runs on the node: a judge of its own (kept per process
and spec), a private temporary cache directory, the same sandbox (one jailed worker per
candidate). It returns the ``EvalResult``; it never touches the run's data directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import tempfile
from typing import Any

from evaluator.containment import jail
from evaluator.correctness.ground_truth import GroundTruth
from evaluator.judge import Judge, JudgeConfig
from evaluator.result import EvalResult, Provenance, Status
from evaluator.figure.timing import Timing
from seeds import task_source
from seeds import task_class_from_source


@dataclasses.dataclass(frozen=True)
class JudgeSpec:
    config: JudgeConfig
    task_source: str
    task_fields: dict[str, Any]
    reference: Timing
    truth: tuple[GroundTruth, ...] | None    # None: the reference failed here; the node tries (and says why)
    provenance: Provenance
    key: str                                 # what identifies the judge a node builds from it

    @classmethod
    def of(cls, judge: Judge, task) -> JudgeSpec:
        """The spec of ``judge`` on ``task``; makes the reference and the ground truth here, once."""
        try:
            reference, truth = judge.ground_truth(task)
            truth = tuple(truth)
        except RuntimeError as exc:
            reference, truth = Timing(None, error=str(exc)), None
        # The node uses the timing source resolved here ("auto" could resolve otherwise there).
        config = dataclasses.replace(judge.config, timing=judge.timing.name, workers=1, cache_dir=None)
        source, fields = task_source(task), task.fields()
        key = hashlib.sha256(json.dumps([repr(config), source, repr(sorted(fields.items()))]).encode()
                             ).hexdigest()[:16]
        return cls(config, source, fields, reference, truth, judge.provenance(task), key)


# The judges this process built, by spec key (a process of a pool serves one run's task, mostly).
_JUDGES: dict[str, tuple[Judge, Any]] = {}
_KEEP = 4


def _judge_for(spec: JudgeSpec) -> tuple[Judge, Any]:
    if spec.key not in _JUDGES:
        while len(_JUDGES) >= _KEEP:
            _JUDGES.pop(next(iter(_JUDGES)))
        cls = task_class_from_source(spec.task_source, f"pallas_evolve_seed_task_{spec.key}")
        task = cls(**spec.task_fields)
        cache = tempfile.mkdtemp(prefix="pallas-evolve-node-cache-")
        judge = Judge(dataclasses.replace(spec.config, cache_dir=cache))
        if spec.truth is not None:
            judge.adopt(task, spec.reference, spec.truth)
        _JUDGES[spec.key] = (judge, task)
    return _JUDGES[spec.key]


def warm_up() -> None:
    """Load the judge and try the jail, once per process, before the first candidate arrives."""
    jail.probe()


def judge_on_this_node(spec: JudgeSpec, source: str, cut: int | None = None) -> EvalResult:
    """Judge ``source`` here, as the orchestrator's judge would. Never raises."""
    try:
        judge, task = _judge_for(spec)
    except Exception as exc:  # noqa: BLE001 - a verdict, never an escaping exception
        return EvalResult(Status.CRASH, stage="judge", provenance=spec.provenance,
                          error=f"node {socket.gethostname()} cannot judge: {type(exc).__name__}: {exc}")
    here = judge.provenance(task)
    if here != spec.provenance:
        return EvalResult(Status.CRASH, stage="judge", provenance=spec.provenance, error=(
            f"node {socket.gethostname()} judges with {_versions(here)}, the run with "
            f"{_versions(spec.provenance)}: install the same pallas-evolve on every node"))
    return judge.evaluate(source, task, prune_above_cycles=cut)


def _versions(p: Provenance) -> str:
    return (f"{p.timing_source} on {p.chip}, jax {p.jax_version}, jaxlib {p.jaxlib_version}, "
            f"libtpu {p.libtpu_version}")
