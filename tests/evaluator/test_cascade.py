"""The cascade: a kernel whose compiler estimate is too slow to matter ends PRUNED after the
compile, without correctness, and never with a speed; a fast kernel is always checked.

Real jail, real compiler, tiny shapes.
"""

from __future__ import annotations

import pytest

from evaluator.program.same import SamePrograms
from evaluator.result import Status

from .conftest import TINY, variant


@pytest.fixture(autouse=True)
def _judged_afresh(judge):
    """These tests are about the stages a judgement runs: the shared judge forgets the programs
    it judged for other tests (which it would otherwise judge once, evaluator/program/same.py)."""
    judge.same = SamePrograms()


def test_a_slow_kernel_is_pruned_with_its_estimate_and_no_speed(judge, seed_source):
    full = judge.evaluate(seed_source, TINY)
    assert full.status is Status.PASS, full.error
    judge.same = SamePrograms()                     # the pruning stage itself, not a reused verdict
    pruned = judge.evaluate(seed_source, TINY, prune_above_cycles=full.metrics.estimated_cycles - 1)
    assert pruned.status is Status.PRUNED and not pruned.ok
    assert pruned.metrics.estimated_cycles == full.metrics.estimated_cycles   # the estimate is kept
    assert f"{full.metrics.estimated_cycles:,}" in pruned.error
    # ... and nothing that selection could use as a speed, nor any sign correctness ran.
    assert pruned.metrics.latency_s is None and pruned.metrics.speedup_vs_reference is None
    assert pruned.metrics.correctness_time_s is None and pruned.metrics.max_abs_error is None
    assert pruned.metrics.compile_time_s and pruned.metrics.lower_time_s is not None


def test_a_fast_but_wrong_kernel_is_never_pruned_it_fails_correctness(judge, seed_source):
    full = judge.evaluate(seed_source, TINY)
    wrong = variant(seed_source, "s = s * sm_scale", "s = s * 1.0")      # as fast, and wrong
    result = judge.evaluate(wrong, TINY, prune_above_cycles=full.metrics.estimated_cycles * 2)
    assert result.status is Status.FAIL_CORRECTNESS, (result.status, result.error)


def test_every_stage_has_its_seconds(judge, seed_source):
    m = judge.evaluate(seed_source, TINY).metrics
    for name in ("sandbox_time_s", "lower_time_s", "compile_time_s", "correctness_time_s", "runner_time_s"):
        assert getattr(m, name) and getattr(m, name) > 0, name
    assert m.lower_time_s + m.compile_time_s + m.correctness_time_s < m.runner_time_s
