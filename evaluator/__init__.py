"""The judge: scores a Pallas TPU kernel against a trusted reference, with or without a TPU.

Its names are imported when first used, so that a light module of this package (the screen,
the timing sources) does not pull in the judge.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"Judge": "evaluator.judge", "JudgeConfig": "evaluator.judge", "StageBudgets": "evaluator.judge",
            "EvalResult": "evaluator.result", "Metrics": "evaluator.result", "Provenance": "evaluator.result",
            "Status": "evaluator.result", "METRIC_COLUMNS": "evaluator.result", "METRIC_PAIRS": "evaluator.result",
            "Limits": "evaluator.containment.sandbox", "Interrupted": "evaluator.containment.sandbox",
            "kill_all_children": "evaluator.containment.sandbox", "CHIPS": "evaluator.chips",
            "get_chip": "evaluator.chips", "timing_choices": "evaluator.figure.timing",
            "roofline": "evaluator.figure.roofline",
            "JudgeSpec": "evaluator.remote", "judge_on_this_node": "evaluator.remote", "warm_up": "evaluator.remote"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'evaluator' has no attribute {name!r}")
