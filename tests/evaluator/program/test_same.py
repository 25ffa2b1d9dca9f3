"""Kernels that are one program get one judgement (evaluator/program/same.py): the trusted
runner's hash of what it lowered, never the worker's word."""

from __future__ import annotations

import dataclasses

import pytest

from evaluator import EvalResult, Metrics, Status
from evaluator.program.same import SamePrograms
from seeds import load_seed


def test_only_verdicts_the_program_alone_decides_are_reused():
    same = SamePrograms()
    task = object()
    for status, digest in ((Status.PASS, "a"), (Status.PRUNED, "b"), (Status.TIMEOUT, "c"), (Status.CRASH, "d"),
                           (Status.FAIL_VMEM, "e")):
        same.remember(task, EvalResult(status, metrics=Metrics(program_sha256=digest, chips=1)))
    same.remember(task, EvalResult(Status.PASS))                 # no hash: nothing to match
    assert same.known(task, 1) == ["a", "e"]
    assert same.known(task, 2) == [] and same.known(object(), 1) == []
    again = same.again(task, 1, "a", 2.0)
    assert again.status is Status.PASS and "judged once" in again.log_tail and again.metrics.runner_time_s == 2.0
    assert same.again(task, 1, "b", 2.0) is None and same.reused == 1


def test_a_reused_pass_is_held_to_the_cut_of_the_judgement_that_reuses_it():
    same = SamePrograms()
    task = object()
    same.remember(task, EvalResult(Status.PASS, metrics=Metrics(
        program_sha256="a", chips=1, estimated_cycles=1000, latency_s=1e-6, speedup_vs_reference=1.5,
        max_abs_error=0.01, compile_time_s=3.0)))
    assert same.again(task, 1, "a", 2.0, prune_above_cycles=1000).status is Status.PASS   # not over it
    cut = same.again(task, 1, "a", 2.0, prune_above_cycles=999)
    assert cut.status is Status.PRUNED and not cut.ok and "1,000" in cut.error and "judged once" in cut.log_tail
    m = cut.metrics
    assert m.estimated_cycles == 1000 and m.program_sha256 == "a"
    assert m.latency_s is None and m.speedup_vs_reference is None and m.max_abs_error is None
    assert m.compile_time_s is None          # this judgement compiled nothing


@pytest.mark.judge
def test_an_edit_the_program_does_not_see_is_judged_once(judge):
    """A comment and a block the wrapper clamps back (min(BLOCK_K, k) at k = 256) lower to the
    seed's own program: the second and third get its verdict, reused; a real block edit does not."""
    from evaluator import Judge

    seed = load_seed("matmul")
    task = seed.task("M=128,K=256,N=256")
    fresh = Judge(dataclasses.replace(judge.config))
    source = seed.kernel_source
    first = fresh.evaluate(source, task)
    assert first.status is Status.PASS and first.metrics.program_sha256
    for edited in (source.replace("BLOCK_M = 128", "BLOCK_M = 128  # a comment"),
                   source.replace("BLOCK_K = 128\n", "BLOCK_K = 128\nUNUSED = 512\n")):
        again = fresh.evaluate(edited, task)
        assert again.metrics.program_sha256 == first.metrics.program_sha256
        assert "judged once" in again.log_tail and again.metrics.estimated_cycles == first.metrics.estimated_cycles
    other = fresh.evaluate(source.replace("BLOCK_N = 128", "BLOCK_N = 256"), task)
    assert other.status is Status.PASS and other.metrics.program_sha256 != first.metrics.program_sha256
    assert "judged once" not in other.log_tail and fresh.same.reused == 2
