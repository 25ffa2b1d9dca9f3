"""Judging several sources at once in tests, as a run does: through the local executor's pool."""

from __future__ import annotations

from collections.abc import Sequence

from evolve.executors.base import LocalExecutor


def judge_all(judge, sources: Sequence[str], task, cut: int | None = None) -> list:
    """``judge``'s verdicts on ``sources`` (in their order), ``judge.config.workers`` at once."""
    with LocalExecutor(judge.config.workers) as executor:
        return executor.judge_all(judge, task, list(sources), cut)
