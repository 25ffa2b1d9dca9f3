"""The judge: scores a Pallas TPU kernel against a trusted reference, with or without a TPU."""

from evaluator.judge import Judge, JudgeConfig, StageBudgets, evaluate
from evaluator.result import EvalResult, Metrics, Provenance, Status
from evaluator.sandbox import Limits

__all__ = ["Judge", "JudgeConfig", "StageBudgets", "evaluate", "EvalResult", "Metrics", "Provenance",
           "Status", "Limits"]
