"""What an evaluation returns: a frozen record with exactly one status, never an exception."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any


class Status(str, enum.Enum):
    """How a candidate's evaluation ended. Only PASS carries a trustworthy speed."""

    PASS = "PASS"
    FAIL_SCREEN = "FAIL_SCREEN"            # the static screen of the source refused it
    FAIL_LOWER = "FAIL_LOWER"              # Pallas -> Mosaic lowering failed (shapes, alignment)
    FAIL_COMPILE = "FAIL_COMPILE"          # the TPU compiler refused it
    FAIL_VMEM = "FAIL_VMEM"                # the kernel does not fit in VMEM
    FAIL_CORRECTNESS = "FAIL_CORRECTNESS"  # wrong numbers, NaN, shape or dtype
    TIMEOUT = "TIMEOUT"                    # a stage ran past its wall-clock budget
    CRASH = "CRASH"                        # the worker died (signal) or broke its protocol
    OOM = "OOM"                            # the worker ran out of host memory
    SUSPECT = "SUSPECT"                    # correct, but faster than the roofline allows
    FAIL_TIMING = "FAIL_TIMING"            # correct, but no timing source could time it
    FAIL_TRACE = "FAIL_TRACE"              # not one program the judge can both check and time
    PRUNED = "PRUNED"                      # compiled; its estimate is too slow to matter, so it
                                           # was never checked: it has no speed and no fitness

    @property
    def ok(self) -> bool:
        return self is Status.PASS


@dataclasses.dataclass(frozen=True)
class Metrics:
    """Everything the judge measured. ``None`` means "not reached" or "not available"."""

    latency_s: float | None = None
    latency_ci_s: tuple[float, float] | None = None   # bootstrap 95% CI (measured timing only)
    reference_latency_s: float | None = None
    speedup_vs_reference: float | None = None
    estimated_cycles: int | None = None
    reference_cycles: int | None = None
    tflops: float | None = None
    mxu_util: float | None = None
    hbm_util: float | None = None
    regime: str | None = None                          # "compute-bound" or "memory-bound"
    roofline_latency_s: float | None = None
    hbm_bytes: int | None = None                       # what the figure counts through HBM (its floor)
    vmem_bytes: int | None = None
    copy_trap: bool | None = None
    chips: int | None = None                           # chips the kernel ran on (a task's mesh: 1 or all)
    compile_time_s: float | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    reference_max_abs_error: float | None = None        # the task's XLA program, same inputs
    # What the program holds as data (evaluator/program/constants.py): every constant and literal, and the
    # largest array computed outside its kernels from constants alone.
    constant_bytes: int | None = None
    constant_computed_bytes: int | None = None
    # Seconds per stage. The worker's start, load and trace are sandbox_time_s; the runner's own
    # start-up is runner_time_s less its stages.
    sandbox_time_s: float | None = None                # the jailed worker: start, load, trace
    lower_time_s: float | None = None                  # the runner lowering both ways, and the audit
    correctness_time_s: float | None = None            # running the CPU program on every input set
    timing_time_s: float | None = None                 # timed runs on a TPU host
    runner_time_s: float | None = None                 # the trusted runner: lower, audit, compile, run
    # Wall seconds per announced stage of each child, as JSON ({"start": before the first, "load": ...}):
    # where a judgement's time went, stage by stage (evolve status; issue 59).
    worker_stage_seconds: str | None = None
    runner_stage_seconds: str | None = None
    # SHA-256 of the program the trusted runner lowered (evaluator/program/same.py): two kernels with one
    # hash are one kernel, judged once
    program_sha256: str | None = None


def _flat_columns() -> tuple[dict[str, type], dict[str, tuple[str, str]]]:
    """The metrics as flat scalar columns, derived from ``Metrics`` so that a new metric is one
    edit: name -> Python type (float, int, str or bool) in field order, and each pair field (a
    confidence interval) -> the two columns it is split into (``X_s`` -> ``X_lo_s``, ``X_hi_s``)."""
    hints = typing.get_type_hints(Metrics)
    columns: dict[str, type] = {}
    pairs: dict[str, tuple[str, str]] = {}
    for field in dataclasses.fields(Metrics):
        hint = hints[field.name]
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) is tuple:
            (kind,) = set(typing.get_args(hint))
            stem, unit = (field.name[:-2], "_s") if field.name.endswith("_s") else (field.name, "")
            pairs[field.name] = (f"{stem}_lo{unit}", f"{stem}_hi{unit}")
            columns.update(dict.fromkeys(pairs[field.name], kind))
        else:
            columns[field.name] = hint
    return columns, pairs


# Every table of metrics (the archive's columns, MLflow's metrics) is derived from these.
METRIC_COLUMNS, METRIC_PAIRS = _flat_columns()


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where the figures came from. Figures of different timing sources are never compared."""

    timing_source: str | None = None    # "measured" or "compiler_estimate"
    chip: str | None = None
    jax_version: str | None = None
    jaxlib_version: str | None = None
    libtpu_version: str | None = None
    correctness_sets: int | None = None  # input sets the candidate was checked on
    secret_sets: int | None = None       # of which drawn in secret by this judge (ground_truth.py)


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """The verdict on one candidate for one task and chip."""

    status: Status
    error: str = ""
    stage: str = ""                      # the last stage reached
    metrics: Metrics = Metrics()
    provenance: Provenance = Provenance()
    wall_time_s: float = 0.0
    log_tail: str = ""                   # bounded tail of the worker's output

    @property
    def ok(self) -> bool:
        return self.status.ok

    @property
    def merit(self) -> float:
        """What a search ranks kernels by: the speedup over the task's reference; where the judge
        has no figure for the reference (its XLA program could not be compiled here), the speed in
        1/µs, which ranks the same way under one judge. 0.0 for a kernel that did not pass."""
        m = self.metrics
        if not self.ok:
            return 0.0
        if m.speedup_vs_reference:
            return m.speedup_vs_reference
        return 1e-6 / m.latency_s if m.latency_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A flat JSON-able dict (metrics and provenance merged in)."""
        out: dict[str, Any] = {"status": self.status.value, "error": self.error,
                               "stage": self.stage, "wall_time_s": self.wall_time_s}
        out.update(dataclasses.asdict(self.metrics))
        out.update(dataclasses.asdict(self.provenance))
        for name in METRIC_PAIRS:
            if out.get(name) is not None:
                out[name] = list(out[name])
        out["log_tail"] = self.log_tail
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        fields_m = {f.name for f in dataclasses.fields(Metrics)}
        fields_p = {f.name for f in dataclasses.fields(Provenance)}
        m = {k: data.get(k) for k in fields_m if k in data}
        for name in METRIC_PAIRS:
            if m.get(name) is not None:
                m[name] = tuple(m[name])
        p = {k: data.get(k) for k in fields_p if k in data}
        return cls(status=Status(data["status"]), error=data.get("error") or "",
                   stage=data.get("stage") or "", metrics=Metrics(**m),
                   provenance=Provenance(**p), wall_time_s=float(data.get("wall_time_s") or 0.0),
                   log_tail=data.get("log_tail") or "")
